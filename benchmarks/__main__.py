"""``make bench``: every benchmark, each beside its baseline; figures to bench-results/."""
from __future__ import annotations

import importlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

MODULES = ["benchmarks.bench_engine", "benchmarks.bench_svm", "benchmarks.bench_nn"]


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip() if \
        subprocess.run(["which", "nvidia-smi"], capture_output=True).returncode == 0 else "no GPU"
    return f"{os.cpu_count()} CPUs ({cpu}), {gpu}, Python {platform.python_version()}"


def main() -> int:
    chosen = sys.argv[1:] or MODULES
    out_dir = Path("bench-results")
    out_dir.mkdir(exist_ok=True)
    report = [f"Machine: {machine()}", f"Command: make bench ({' '.join(chosen)})",
              f"Date: {time.strftime('%Y-%m-%d %H:%M')}", ""]
    for name in chosen:
        module = importlib.import_module(name)
        print(f"== {name}", file=sys.stderr, flush=True)
        result = module.main()
        (out_dir / f"{name.rsplit('.', 1)[-1]}.json").write_text(json.dumps(result, indent=2))
        report += [result["markdown"], ""]
        print(result["markdown"], flush=True)
    (out_dir / "report.md").write_text("\n".join(report))
    print(f"\nfigures in {out_dir}/report.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
