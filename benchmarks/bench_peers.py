"""Ours beside the tools users would pick instead, on the same work, in interleaved rounds.

Systems (2 workers each): concurrent.futures.ProcessPoolExecutor (the baseline of every ratio, in
the same round), mpi4py.futures, Dask distributed, Ray, Parsl (HighThroughputExecutor), joblib
(loky), and ours as 1 rank x 2 workers and 2 ranks x 1 worker (real mpiexec). Each is written as its
users write it (``benchmarks/peers/run.py``, ``benchmarks/peers/ours.py``) and started as a fresh
program, so launch includes the interpreter and the imports. A peer not installed is one line and
skipped (``pip install -e .[peers]``).

Workloads:
- ``noop``: 5,000 no-op items: ms per item ((last end - first end) / (N - 1)), launch to the first
  result, and the last result to the program's exit;
- ``skew``: 400 sleep items, lognormal durations (sigma 1, mean 20 ms): makespan / ideal, ideal being
  max(total / 2, longest); every system is given them longest first, as a user who knows the
  durations would (the peers submit them so, ours gets them as cost hints);
- ``skew-random``: the same items in their random order everywhere (ours without cost hints);
- ``kill``: 40 items of 50 ms, one SIGKILLs its worker on its first attempt: does the run complete
  with each result once, and how late is that item (its result's end - the kill - its duration);
- ``stop``: the same with SIGSTOP (a hung worker): detected within ``--hang-cap`` s? when? (one round);
- ``resume``: ours only (the peers as written keep nothing): 400 items of 10 ms, the whole job
  SIGKILLed after 150 results are journaled, then rerun with ``--resume``: items recomputed.

    python -m benchmarks.bench_peers [--rounds 3] [--systems ppe,ours-1x2,...] [--hang-cap 30]
        [--baseline-tree CHECKOUT]    (before/after: our app on another checkout's engine too)

Writes bench-results/bench_peers.json, bench_peers.md (the table) and bench_peers.png (ratios).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

from benchmarks.machine import cpu_model
from common.results.layout import ResultsLayout

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
MPIEXEC = os.path.join(sys.prefix, "bin", "mpiexec")
WORKERS = 2
SYSTEMS = ["ppe", "mpi4py", "dask", "ray", "parsl", "joblib", "ours-1x2", "ours-2x1"]
TITLES = {"ppe": "ProcessPoolExecutor", "mpi4py": "mpi4py.futures", "dask": "Dask distributed", "ray": "Ray",
          "parsl": "Parsl HTEX", "joblib": "joblib (loky)", "ours-1x2": "ours 1x2", "ours-2x1": "ours 2x1",
          "base-1x2": "baseline 1x2", "base-2x1": "baseline 2x1"}
#: the module each system needs (None: always there)
NEEDS = {"ppe": None, "mpi4py": "mpi4py", "dask": "distributed", "ray": "ray", "parsl": "parsl", "joblib": "joblib",
         "ours-1x2": None, "ours-2x1": "mpi4py", "base-1x2": None, "base-2x1": "mpi4py"}


def spec_for(workload: str) -> Dict[str, Any]:
    if workload == "noop":
        return {"durations": [0.0] * 5000, "fault": ""}
    if workload in ("skew", "skew-random"):
        raw = np.random.default_rng(12345).lognormal(0.0, 1.0, 400)
        return {"durations": (raw / raw.mean() * 0.02).tolist(), "fault": "", "longest_first": workload == "skew"}
    if workload in ("kill", "stop"):
        return {"durations": [0.05] * 40, "fault": workload, "fault_index": 10}
    if workload == "resume":
        return {"durations": [0.01] * 400, "fault": ""}
    raise ValueError(workload)


def command(system: str, spec: Path, out: Path, extra: List[str], baseline_app: Optional[Path] = None) -> List[str]:
    if system.startswith(("ours", "base")):
        ranks, workers = (1, 2) if system.endswith("1x2") else (2, 1)
        app = [str(baseline_app)] if system.startswith("base") else ["-m", "benchmarks.peers.ours"]
        ours = [PY, *app, str(spec), "--workers", str(workers), "--gpu", "cpu", "--no-progress", "--results", str(out),
                *extra]
        return [MPIEXEC, "-n", str(ranks), *ours] if ranks > 1 else ours
    if system == "mpi4py":  # 1 manager + 2 workers, as mpi4py.futures' docs start it
        return [MPIEXEC, "-n", str(WORKERS + 1), PY, "-m", "mpi4py.futures", "-m", "benchmarks.peers.run", system,
                str(spec), str(out)]
    return [PY, "-m", "benchmarks.peers.run", system, str(spec), str(out)]


#: the hung-worker workload: ours ends a worker silent this long (--worker-timeout), and so does
#: Dask (its scheduler drops a worker silent for its worker-ttl); no such setting was found for the
#: other peers, whose liveness stays at its defaults (Parsl runs with retries=1 in every workload)
HUNG_TIMEOUT = 10.0
HUNG_SETTINGS = {"dask": {"DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL": f"{HUNG_TIMEOUT:g}s"}}


def launch(cmd: List[str], cap: float, until: Optional[Any] = None, pythonpath: Path = REPO,
           settings: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Run ``cmd`` in its own session; kill the whole session after ``cap`` s, or (``until``) once
    ``until()`` is true. ``settings``: more environment. Returns launch and exit times, the exit
    code and whether it was killed."""
    # the venv's bin first, as for a user who activated it (Parsl starts its interchange from there)
    env = {**os.environ, "PYTHONPATH": str(pythonpath), "RAY_DEDUP_LOGS": "0",
           "PATH": os.path.dirname(PY) + os.pathsep + os.environ.get("PATH", ""), **(settings or {})}
    launched = time.time()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    killed = False
    deadline = time.monotonic() + cap
    while proc.poll() is None:
        if time.monotonic() > deadline or (until is not None and until()):
            os.killpg(proc.pid, signal.SIGKILL)
            killed = True
            proc.wait()
            break
        time.sleep(0.002)
    exited = time.time()
    stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    try:  # what the program left behind (Ray's, Dask's daemons; a stopped worker)
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return {"launched": launched, "exited": exited, "code": proc.returncode, "killed": killed,
            "stderr_tail": stderr.strip().splitlines()[-1:] if stderr.strip() else []}


def results_of(system: str, out: Path) -> Dict[str, Any]:
    """[(index, start, end)], version, error of a finished run."""
    if system.startswith(("ours", "base")):
        rows, error = [], None
        try:
            for line in ResultsLayout(out).journal.read_text().splitlines():
                entry = json.loads(line)
                if entry.get("type") == "result":
                    rows.append(tuple(entry["result"]))
        except (OSError, ValueError) as problem:
            error = str(problem)
        return {"results": rows, "version": "multinode-gpu 0.1.0", "error": error}
    try:
        answer = json.loads(out.read_text())
    except (OSError, ValueError):
        return {"results": [], "error": "no output (killed or crashed)"}
    return {"results": [tuple(row[:3]) for row in answer["results"]], "version": answer.get("version"),
            "error": answer.get("error")}


def measure(system: str, workload: str, folder: Path, cap: float, baseline: Optional[Path] = None) -> Dict[str, Any]:
    """One run of ``workload`` through ``system``; its figures. ``baseline``: the other checkout
    whose engine the base-* systems run."""
    spec = spec_for(workload)
    marker_dir = folder / "markers"
    marker_dir.mkdir()
    spec.update(workers=WORKERS, marker_dir=str(marker_dir))
    spec_path = folder / "spec.json"
    spec_path.write_text(json.dumps(spec))
    ours = system.startswith(("ours", "base"))
    out = folder / ("results" if ours else "out.json")
    extra = ["--worker-timeout", f"{HUNG_TIMEOUT:g}"] if workload == "stop" and ours else []
    # the hung worker: a peer that has a liveness setting of its own gets the same timeout as ours
    settings = HUNG_SETTINGS.get(system, {}) if workload == "stop" else {}
    baseline_app = None
    if system.startswith("base"):  # our app, run as a script on the other checkout's engine
        baseline_app = folder / "app" / "ours.py"
        baseline_app.parent.mkdir()
        for name in ("ours.py", "work.py"):
            (baseline_app.parent / name).write_text((REPO / "benchmarks" / "peers" / name).read_text())
    run = launch(command(system, spec_path, out, extra, baseline_app), cap,
                 pythonpath=baseline if system.startswith("base") and baseline else REPO, settings=settings)
    got = results_of(system, out)
    rows = got["results"]
    n = len(spec["durations"])
    figures: Dict[str, Any] = {"system": system, "workload": workload, "version": got.get("version"),
                               "error": got.get("error"), "code": run["code"], "killed": run["killed"],
                               "stderr_tail": run["stderr_tail"]}
    indices = [row[0] for row in rows]
    figures["complete"] = sorted(set(indices)) == list(range(n)) and not run["killed"]
    figures["each_once"] = len(indices) == len(set(indices))
    if not rows:
        return figures
    ends = sorted(row[2] for row in rows)
    if workload == "noop" and figures["complete"]:
        figures["ms_per_item"] = (ends[-1] - ends[0]) / (n - 1) * 1000
        figures["launch_to_first_s"] = ends[0] - run["launched"]
        figures["last_to_exit_s"] = run["exited"] - ends[-1]
    if workload in MAKESPANS and figures["complete"]:
        ideal = max(sum(spec["durations"]) / WORKERS, max(spec["durations"]))
        figures[MAKESPANS[workload]] = (ends[-1] - min(row[1] for row in rows)) / ideal
    if workload in ("kill", "stop"):
        fault_at = marker_dir / f"fault-{spec['fault_index']}.time"
        late = [row[2] for row in rows if row[0] == spec["fault_index"]]
        if fault_at.exists() and late:
            figures["fault_delay_s"] = max(late) - float(fault_at.read_text()) - spec["durations"][spec["fault_index"]]
    return figures


def resume_row(system: str, folder: Path) -> Dict[str, Any]:
    """Ours: the whole job SIGKILLed once 150 results are journaled, then rerun with --resume."""
    spec = spec_for("resume")
    spec.update(workers=WORKERS, marker_dir=str(folder))
    spec_path = folder / "spec.json"
    spec_path.write_text(json.dumps(spec))
    out = folder / "results"
    journal = ResultsLayout(out).journal

    def journaled() -> int:
        try:
            return journal.read_bytes().count(b'"type":"result"')
        except OSError:
            return 0

    first = launch(command(system, spec_path, out, []), 120, until=lambda: journaled() >= 150)
    before = journaled()
    second = launch(command(system, spec_path, out, ["--resume"]), 120)
    summary = json.loads(ResultsLayout(out).summary_json.read_text()) if ResultsLayout(out).summary_json.exists() else {}
    return {"system": system, "workload": "resume", "killed": first["killed"], "journaled_at_kill": before,
            "code": second["code"], "complete": summary.get("status") == "complete",
            "recomputed": summary.get("items_this_run")}


def available(systems: List[str]) -> List[str]:
    chosen = []
    for system in systems:
        module = NEEDS[system]
        if module is not None and importlib.util.find_spec(module) is None:
            print(f"bench_peers: {TITLES[system]} skipped: {module} is not installed (pip install -e '.[peers]')",
                  flush=True)
            continue
        if system in ("mpi4py", "ours-2x1", "base-2x1") and not os.path.exists(MPIEXEC):
            print(f"bench_peers: {TITLES[system]} skipped: no {MPIEXEC}", flush=True)
            continue
        chosen.append(system)
    return chosen


def median(values: List[float]) -> Optional[float]:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


#: the figure each skew workload gives: the same items, longest first everywhere or in their random order
MAKESPANS = {"skew": "makespan_over_ideal", "skew-random": "random_makespan_over_ideal"}
METRICS = [("noop", "ms_per_item", "5,000 no-op items, ms per item", "{:.3f}"),
           ("noop", "launch_to_first_s", "launch to first result, s", "{:.2f}"),
           ("noop", "last_to_exit_s", "last result to exit, s", "{:.2f}"),
           ("skew", "makespan_over_ideal", "400 lognormal items (sigma 1, mean 20 ms) given longest first to every "
                                           "system, makespan / ideal", "{:.3f}"),
           ("skew-random", "random_makespan_over_ideal", "the same 400 items in random order everywhere (ours without "
                                                         "cost hints), makespan / ideal", "{:.3f}")]


def summarise(runs: List[Dict[str, Any]], systems: List[str]) -> Dict[str, Any]:
    """Medians over rounds of each figure, and of its ratio to ProcessPoolExecutor's in the same round."""
    table: Dict[str, Dict[str, Any]] = {}
    for workload, metric, _, _ in METRICS:
        for system in systems:
            mine = [r for r in runs if r["system"] == system and r["workload"] == workload]
            ratios = []
            for run in mine:
                base = next((r for r in runs if r["system"] == "ppe" and r["workload"] == workload
                             and r["round"] == run["round"]), None)
                if base and base.get(metric) and run.get(metric) is not None:
                    ratios.append(run[metric] / base[metric])
            table.setdefault(metric, {})[system] = {"median": median([r.get(metric) for r in mine]),
                                                    "ratio": median(ratios), "rounds": len(mine)}
    return table


def fault_cell(runs: List[Dict[str, Any]], system: str, workload: str) -> str:
    mine = [r for r in runs if r["system"] == system and r["workload"] == workload]
    if not mine:
        return "n/a"
    done = [r for r in mine if r["complete"] and r["each_once"]]
    if not done:
        why = ("still hung at the cap, killed" if mine[0]["killed"]
               else mine[0].get("error") or f"exit {mine[0]['code']}")
        return f"no ({why})"[:80].replace("|", "/")
    delay = median([r.get("fault_delay_s") for r in done])
    return f"yes{'' if len(done) == len(mine) else f' ({len(done)} of {len(mine)})'}" + (
        f", +{delay:.2f} s" if delay is not None else "")


def markdown(runs: List[Dict[str, Any]], systems: List[str], table: Dict[str, Any], rounds: int, cap: float) -> str:
    header = "| workload | " + " | ".join(TITLES[s] for s in systems) + " |"
    lines = [header, "|---" * (len(systems) + 1) + "|"]
    ran = {r["workload"] for r in runs}  # the rows and notes of the workloads not asked for are left out
    for workload, metric, title, fmt in METRICS:
        if workload not in ran:
            continue
        cells = []
        for system in systems:
            cell = table[metric][system]
            if cell["median"] is None:
                cells.append("n/a")
                continue
            ratio = "" if system == "ppe" or cell["ratio"] is None else f" ({cell['ratio']:.2f}x)"
            cells.append(fmt.format(cell["median"]) + ratio)
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    if "kill" in ran:
        lines.append("| one worker SIGKILLed: completes, each result once; the item's delay | "
                     + " | ".join(fault_cell(runs, s, "kill") for s in systems) + " |")
    if "stop" in ran:
        lines.append(f"| one worker SIGSTOPped (hung): completes within {cap:.0f} s? the item's delay | "
                     + " | ".join(fault_cell(runs, s, "stop") for s in systems) + " |")
    resume = {r["system"]: r for r in runs if r["workload"] == "resume"}
    if resume:
        lines.append("| whole job SIGKILLed after 150 of 400 results, then rerun: items recomputed | "
                     + " | ".join((f"{resume[s]['recomputed']}" if resume[s].get("complete") else "failed")
                                  if s in resume else "not run (its checkpointing not set up)" for s in systems) + " |")
    versions = sorted({r["version"] for r in runs if r.get("version")})
    notes = [f"Medians of {rounds} interleaved round(s); in brackets the median ratio to ProcessPoolExecutor's "
             f"figure in the same round."]
    if "parsl" in systems:
        notes.append("Parsl runs with retries=1 (its default is 0, with which a task whose worker is killed fails "
                     "instead of running again); the other peers run at their defaults except where a row says.")
    if "stop" in ran:
        notes.append(f"The hung-worker row: one round, ours with --worker-timeout {HUNG_TIMEOUT:g} (default 300 s), "
                     f"Dask with its worker-ttl at the same {HUNG_TIMEOUT:g} s (default 5 minutes), no liveness setting of "
                     f"the other peers tuned (no setting of theirs that ends a hung worker and reruns its item was found), "
                     f"each killed at {cap:.0f} s.")
    if resume and any(s not in resume for s in systems):
        notes.append("The rerun row: the peers were run without their own checkpointing (Parsl's, joblib.Memory), "
                     "so not at all.")
    lines += ["", " ".join(notes),
              f"Versions: {', '.join(versions)}.", f"Machine: {os.cpu_count()} CPUs ({cpu_model()})."]
    return "\n".join(lines)


def figure(table: Dict[str, Any], systems: List[str], path: Path) -> None:
    from common.results.outputs import new_figure, save_figure

    labels = ["no-op items: ms per item", "launch to first result", "last result to exit",
              "lognormal items longest first:\nmakespan / ideal", "lognormal items in random order:\nmakespan / ideal"]
    # the workloads that ran: a group of bars each
    shown = [(metric, label) for (_, metric, _, _), label in zip(METRICS, labels)
             if any(table[metric][system]["median"] is not None for system in systems)]
    if not shown:
        return
    fig, ax = new_figure(9, 4)
    width = 0.8 / len(systems)
    for position, system in enumerate(systems):
        ratios = [table[metric][system]["ratio"] or np.nan for metric, _ in shown]
        ax.bar(np.arange(len(shown)) + position * width, ratios, width, label=TITLES[system])
    ax.set_xticks(np.arange(len(shown)) + 0.4 - width / 2, [label for _, label in shown], fontsize=8)
    ax.set_yscale("log")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylabel("ratio to ProcessPoolExecutor\n(median over rounds, each in its round)")
    ax.legend(fontsize=7, ncol=len(systems), loc="upper center", bbox_to_anchor=(0.5, -0.12), frameon=False)
    save_figure(fig, path, formats=("png",))


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_peers", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated, of: " + ", ".join(SYSTEMS))
    parser.add_argument("--workloads", default="noop,skew,skew-random,kill,stop,resume")
    parser.add_argument("--hang-cap", type=float, default=30.0, help="seconds a hung-worker run gets")
    parser.add_argument("--name", default="bench_peers", help="bench-results/NAME.md, .json and .png")
    parser.add_argument("--baseline-tree", type=Path, default=None,
                        help="another checkout of this project (e.g. a git worktree of an earlier commit): adds "
                             "base-1x2 and base-2x1, our app on that checkout's engine, for before/after figures")
    args = parser.parse_args(argv)
    asked = [s for s in args.systems.split(",") if s]
    if args.baseline_tree is not None:
        if not (args.baseline_tree / "common" / "__init__.py").is_file():
            print(f"bench_peers: error: --baseline-tree {args.baseline_tree}: not a checkout of this project",
                  file=sys.stderr)
            return 2
        args.baseline_tree = args.baseline_tree.resolve()
        asked += [s for s in ("base-1x2", "base-2x1") if s not in asked]
    unknown = [s for s in asked if s not in SYSTEMS + ["base-1x2", "base-2x1"]]
    if unknown:
        print(f"bench_peers: error: unknown system(s) {', '.join(unknown)}; choose from {', '.join(SYSTEMS)}",
              file=sys.stderr)
        return 2
    systems = available(asked)
    workloads = [w for w in args.workloads.split(",") if w]
    runs: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench_peers.") as scratch:
        count = 0
        for round_ in range(args.rounds):
            for workload in [w for w in workloads if w in ("noop", *MAKESPANS, "kill")] + (
                    ["stop"] if "stop" in workloads and round_ == 0 else []):
                for system in systems:  # interleaved: every system once per round and workload
                    count += 1
                    folder = Path(scratch) / str(count)
                    folder.mkdir()
                    cap = args.hang_cap if workload == "stop" else 300.0
                    figures = measure(system, workload, folder, cap, args.baseline_tree)
                    figures["round"] = round_
                    runs.append(figures)
                    shown = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in figures.items()
                             if k in ("ms_per_item", "launch_to_first_s", "last_to_exit_s", *MAKESPANS.values(),
                                      "fault_delay_s", "complete", "error")}
                    print(f"round {round_ + 1} {workload:11s} {system:9s} {shown}", flush=True)
        if "resume" in workloads:
            for system in [s for s in systems if s.startswith("ours")]:
                count += 1
                folder = Path(scratch) / str(count)
                folder.mkdir()
                runs.append(resume_row(system, folder))
                print(f"resume {system}: {runs[-1]}", flush=True)
    table = summarise(runs, systems)
    out = Path("bench-results")
    out.mkdir(exist_ok=True)
    text = markdown(runs, systems, table, args.rounds, args.hang_cap)
    (out / f"{args.name}.json").write_text(json.dumps({"runs": runs, "table": table}, indent=2))
    (out / f"{args.name}.md").write_text(text + "\n")
    if "ppe" in systems:
        figure(table, systems, out / args.name)
    print(text)
    missed = targets_missed(runs, table, systems)
    print("\ntargets (ours, per no-op item <= ProcessPoolExecutor's, launch to first result <= 2x its, last result to "
          "exit <= 0.5 s, skew makespan <= its, a killed worker's run completes): "
          + ("met" if not missed else "NOT met: " + "; ".join(missed)))
    return 1 if missed else 0


def targets_missed(runs: List[Dict[str, Any]], table: Dict[str, Any], systems: List[str]) -> List[str]:
    """Issue 31's targets for ours, each against ProcessPoolExecutor's median ratio in the same rounds."""
    missed = []
    limits = {"ms_per_item": 1.0, "launch_to_first_s": 2.0, **{metric: 1.0 for metric in MAKESPANS.values()}}
    for system in [s for s in systems if s.startswith("ours")]:
        for metric, limit in limits.items():
            ratio = table[metric][system]["ratio"]
            if ratio is not None and ratio > limit:
                missed.append(f"{TITLES[system]} {metric} {ratio:.2f}x (target <= {limit:g}x)")
        last = table["last_to_exit_s"][system]["median"]
        if last is not None and last > 0.5:
            missed.append(f"{TITLES[system]} last result to exit {last:.2f} s (target <= 0.5 s)")
        if any(not r["complete"] for r in runs if r["system"] == system and r["workload"] == "kill"):
            missed.append(f"{TITLES[system]}: a run with a killed worker did not complete")
    return missed


if __name__ == "__main__":
    raise SystemExit(main())
