"""``make bench``: every benchmark, each beside its baseline in the same run.

Each benchmark is its own module (``python -m benchmarks.bench_engine`` etc.) that prints a
markdown table, writes its JSON to ``bench-results/`` and exits 1 if its target is not met.
This runs them in turn and writes ``bench-results/report.md`` with the machine they ran on.
"""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

from benchmarks import command_line
from benchmarks.machine import cpu_model

#: bench_peers measures the peers that are installed (make bench-peers installs them) and skips the others
MODULES = ["benchmarks.bench_engine", "benchmarks.bench_peers", "benchmarks.bench_sweep", "benchmarks.bench_scale",
           "benchmarks.bench_svm", "benchmarks.bench_nn"]


def machine() -> str:
    cpu = cpu_model()
    gpu = "no GPU"
    if shutil.which("nvidia-smi"):
        gpu = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip() or gpu
    return f"{os.cpu_count()} CPUs ({cpu}), {gpu}, Python {platform.python_version()}"


def main(argv: Optional[List[str]] = None) -> int:
    parser = command_line("benchmarks", __doc__)
    parser.add_argument("modules", nargs="*", metavar="MODULE",
                        help=f"the benchmarks to run, in turn, by module or short name (default: all of "
                             f"{', '.join(MODULES)})")
    # bench_engine or benchmarks.bench_engine
    chosen = [name if name.startswith("benchmarks.") else f"benchmarks.{name}" for name in parser.parse_args(argv).modules]
    unknown = [name for name in chosen if name not in MODULES]
    if unknown:
        parser.error(f"no benchmark {', '.join(repr(name.split('.', 1)[1]) for name in unknown)}: choose from "
                     f"{', '.join(name.split('.', 1)[1] for name in MODULES)}")
    chosen = chosen or MODULES
    out_dir = Path("bench-results")
    out_dir.mkdir(exist_ok=True)
    report = [f"Machine: {machine()}", f"Date: {time.strftime('%Y-%m-%d %H:%M')}", ""]
    failed = []
    for name in chosen:
        print(f"== python -m {name}", flush=True)
        proc = subprocess.run([sys.executable, "-m", name], stdout=subprocess.PIPE, text=True)
        print(proc.stdout, flush=True)
        report += [f"## python -m {name} (exit {proc.returncode})", "", proc.stdout.strip(), ""]
        if proc.returncode != 0:
            failed.append(name)
    (out_dir / "report.md").write_text("\n".join(report))
    print(f"report: {out_dir}/report.md" + (f"; targets not met: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
