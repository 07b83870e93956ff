"""``make gpu-check``: everything that needs a GPU, in one command, into one report.

PYTHONPATH=. python -m benchmarks.gpu_check [--out DIR] [--smoke]

Meant for a machine with an NVIDIA GPU and a CUDA build of torch where nothing can be installed:
it needs only the checkout (no editable install) and what it imports (torch, numpy, scikit-learn,
matplotlib, tqdm; nvidia-ml-py, mpi4py, torchvision and cuML where present). In under 8 minutes it
runs, each step with its own time limit, a failure in one never stopping the others:

- mnist_nn on the GPU on the digits (and on Fashion-MNIST where its files are found) with
  ``--workers-per-gpu 1`` and ``4``, whose results must be identical; the NVML monitor's samples
  from those runs;
- every GPU's workers, two per GPU, reporting from inside what they see (CUDA_VISIBLE_DEVICES,
  torch's device count and the GPU's name);
- a training epoch under torch's sync debug mode (no synchronisation per batch) and two fits with
  the same seed (the same bits);
- ``benchmarks.bench_nn`` on CUDA against the reference's style, with 4 workers per GPU;
- mnist_svm on cuML where cuML is installed (one line saying it was skipped otherwise).

It writes ``gpu-check.md`` and ``gpu-check.json`` into ``--out`` (default
``bench-results/gpu-check``) and exits 1 if a step failed. Without a GPU it says so in one line and
exits 0. ``--smoke`` (for the project's tests) runs the same steps on the CPU at toy sizes, so the
script itself is tested where there is no GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from common.app import App
from common.items import Item

REPO = Path(__file__).resolve().parents[1]
#: the whole check stays under 8 minutes: each step gets at most this, and none starts past the deadline
STEP_SECONDS = 200
DEADLINE_SECONDS = 7 * 60


class PinningApp(App):
    """One item per worker slot: each reports what its worker sees of the GPUs."""

    name = "gpu_check_pinning"
    module = "benchmarks.gpu_check"

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("n_items", type=int)

    def items(self) -> List[Item]:
        return [Item(f"item-{i:03d}", {}) for i in range(self.args.n_items)]

    def run_item(self, state: Any, item: Item, seed: Any) -> Dict[str, Any]:
        import torch

        time.sleep(0.3)  # long enough that every worker gets items
        cuda = torch.cuda.is_available()
        return {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "pid": os.getpid(),
                "device_count": torch.cuda.device_count() if cuda else 0,
                "name": torch.cuda.get_device_name(0) if cuda else None}


class Check:
    """Runs the steps, records each, and writes the report."""

    def __init__(self, out: Path, smoke: bool):
        self.out, self.smoke, self.started = out, smoke, time.monotonic()
        self.steps: List[Dict[str, Any]] = []

    def step(self, title: str, run: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
        if time.monotonic() - self.started > DEADLINE_SECONDS:
            record = {"title": title, "status": "skipped", "note": "the check's 7-minute deadline had passed"}
        else:
            start = time.monotonic()
            try:
                record = {"title": title, "status": "ok", **run()}
            except Exception as error:  # one step failing must not stop the others
                record = {"title": title, "status": "failed", "error": f"{type(error).__name__}: {error}"}
            record["seconds"] = round(time.monotonic() - start, 1)
        self.steps.append(record)
        print(f"gpu-check: {title}: {record['status']} {record.get('note') or record.get('error') or ''}".rstrip(),
              flush=True)
        return record

    def command(self, argv: List[str], env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
        """Run ``python argv`` in the checkout; raise with its stderr's tail if it fails."""
        shown = "python " + " ".join(argv)
        child = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
                     **(env or {}))
        start = time.monotonic()
        proc = subprocess.run([sys.executable, *argv], cwd=REPO, env=child, capture_output=True, text=True,
                              timeout=STEP_SECONDS)
        if proc.returncode != 0:
            raise RuntimeError(f"`{shown}` exited {proc.returncode}: {proc.stderr.strip()[-600:]}")
        return {"command": shown, "wall_seconds": round(time.monotonic() - start, 1), "stdout": proc.stdout}

    # ----- the steps -----
    def mnist_nn(self, dataset: str, workers_per_gpu: int) -> Dict[str, Any]:
        """The default seed's 2 2 on the digits (nets of up to 501M weights), 1 1 on Fashion-MNIST."""
        results = self.out / "runs" / f"mnist_nn-{dataset}-wpg{workers_per_gpu}"
        shutil.rmtree(results, ignore_errors=True)
        size = ["2", "2"] if dataset == "digits" else ["1", "1"]
        if self.smoke:  # two CPU workers stand for the GPU's four
            size = ["1", "1", "--gpu", "cpu", "--workers", str(min(workers_per_gpu, 2)), "--threads", "1",
                    "--max-macs", "1e6", "--subsample", "300", "--max-epochs", "2"]
        else:
            size += ["--gpu", "all", "--workers-per-gpu", str(workers_per_gpu)]
        ran = self.command(["-m", "mnist_nn", *size, "--dataset", dataset, "--no-progress", "--results", str(results)])
        summary = json.loads((results / "summary.json").read_text())
        return {"command": ran["command"], "wall_seconds": ran["wall_seconds"], "results": str(results),
                "items_done": summary["items_done"], "item_seconds_total": summary["item_seconds_total"],
                "ensemble_test_error": summary.get("ensemble_test_error"), "gpu_usage": summary.get("gpu_usage", {}),
                "workers": summary.get("workers")}

    def same_results(self, dataset: str) -> Dict[str, Any]:
        """--workers-per-gpu 1 and 4 gave the same models (GPUs of one model, deterministic algorithms)."""
        folders = [self.out / "runs" / f"mnist_nn-{dataset}-wpg{n}" for n in (1, 4)]
        same = {name: (folders[0] / name).read_text() == (folders[1] / name).read_text()
                for name in ("results.csv", "cv_results.csv")}
        if not all(same.values()):
            raise AssertionError(f"--workers-per-gpu 1 and 4 differ: {same}")
        return {"note": "results.csv and cv_results.csv identical"}

    def pinning(self) -> Dict[str, Any]:
        results = self.out / "runs" / "pinning"
        shutil.rmtree(results, ignore_errors=True)
        env = {"CUDA_VISIBLE_DEVICES": "0,1"} if self.smoke else {}  # smoke: two made-up GPUs
        script = ("from benchmarks.gpu_check import PinningApp; from common.runner import main; "
                  "import sys; raise SystemExit(main(PinningApp, sys.argv[1:]))")
        ran = self.command(["-c", script, "16", "--gpu", "all", "--workers-per-gpu", "2", "--no-progress",
                            "--results", str(results)], env=env)
        seen = {}
        for line in (results / "journal.jsonl").read_text().splitlines():
            entry = json.loads(line)
            if entry.get("type") == "result":
                seen.setdefault(entry["worker"], {k: v for k, v in entry["result"].items() if k != "pid"})
        gpus = {worker.split("-")[1].split(".")[0] for worker in seen}
        wrong = {w: s for w, s in seen.items() if s["device_count"] != (0 if self.smoke else 1)}
        if wrong:
            raise AssertionError(f"workers seeing other than one GPU: {wrong}")
        return {"command": ran["command"], "workers": seen, "note": f"{len(seen)} workers on {len(gpus)} GPU(s)"}

    def in_process(self) -> Dict[str, Any]:
        """No synchronisation per batch in an epoch; the same seed gives the same bits."""
        import warnings

        import numpy as np
        import torch

        from common.data import load_dataset
        from mnist_nn.search import Candidate
        from mnist_nn.train import fit, to_device

        device = "cpu" if self.smoke else "cuda"
        torch.use_deterministic_algorithms(True, warn_only=True)
        data = to_device(load_dataset("digits", subsample=400, seed=0), device)
        candidate, index = Candidate(8, 5, 64, 0.01, 0.5), np.arange(100 if self.smoke else 300)
        syncs = None
        if device == "cuda":
            torch.cuda.set_sync_debug_mode("warn")
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    fit(data.x_train, data.y_train, index, candidate, 2, 10, init_seed=0)
            finally:
                torch.cuda.set_sync_debug_mode("default")
            syncs = sum("synchroniz" in str(w.message) for w in caught)
            if syncs > 8:
                raise AssertionError(f"{syncs} synchronisations in 2 epochs of 30 batches")
        nets = [fit(data.x_train, data.y_train, index, candidate, 2, 10, init_seed=4)[0] for _ in range(2)]
        same = all(torch.equal(a, b) for a, b in zip(nets[0].state_dict().values(), nets[1].state_dict().values()))
        if not same:
            raise AssertionError("two fits with the same seed differ")
        counted = "not counted: no CUDA" if syncs is None else f"{syncs} synchronisations in 2 epochs of 30 batches"
        return {"synchronisations_in_2_epochs": syncs, "note": f"same bits twice; {counted}"}

    def bench_nn(self) -> Dict[str, Any]:
        report = self.out / "bench_nn.json"
        argv = ["-m", "benchmarks.bench_nn", "--no-run", "--repeats", "1", "--out", str(report)]
        argv += ["--device", "cpu", "--quick"] if self.smoke else ["--device", "cuda", "--workers-per-gpu", "4"]
        ran = self.command(argv)
        return {"command": ran["command"], "table": ran["stdout"], "fits": json.loads(report.read_text())["fits"]}

    def mnist_svm(self) -> Dict[str, Any]:
        try:
            import cuml  # noqa: F401
        except Exception:
            return {"status": "skipped", "note": "cuML is not installed: mnist_svm on the GPU not checked"}
        results = self.out / "runs" / "mnist_svm"
        shutil.rmtree(results, ignore_errors=True)
        ran = self.command(["-m", "mnist_svm", "8", "--dataset", "digits", "--gpu", "all", "--no-progress",
                            "--results", str(results)])
        summary = json.loads((results / "summary.json").read_text())
        return {"command": ran["command"], "wall_seconds": ran["wall_seconds"], "note": f"test error {summary.get('test_error')}",
                "item_seconds_total": summary["item_seconds_total"], "test_error": summary.get("test_error"),
                "gpu_usage": summary.get("gpu_usage", {})}

    # ----- the report -----
    def write(self, environment: Dict[str, Any]) -> bool:
        ok = all(step["status"] != "failed" for step in self.steps)
        report = {"ok": ok, "smoke": self.smoke, "environment": environment, "steps": self.steps}
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "gpu-check.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
        lines = [f"# make gpu-check{' (--smoke: on the CPU, toy sizes)' if self.smoke else ''}", "",
                 *[f"- {key}: {value}" for key, value in environment.items()], "",
                 "| step | status | seconds | note |", "|---|---|---|---|"]
        for step in self.steps:
            note = step.get("note") or step.get("error") or step.get("command", "")
            lines.append(f"| {step['title']} | {step['status']} | {step.get('seconds', '')} | "
                         f"{str(note).replace('|', '/')[:300]} |")
        for step in self.steps:
            if step.get("gpu_usage"):
                lines += ["", f"## NVML samples: {step['title']}", "", "| GPU | samples | util mean % | util peak % "
                          "| memory peak MiB |", "|---|---|---|---|---|"]
                lines += [f"| {gpu} | {u.get('samples')} | {u.get('util_mean_percent')} | {u.get('util_peak_percent')} "
                          f"| {u.get('memory_peak_mib')} |" for gpu, u in step["gpu_usage"].items()]
            if step.get("table"):
                lines += ["", f"## {step['title']}", "", step["table"].strip()]
            if step.get("workers") and step["title"].startswith("pinning"):
                lines += ["", "## What each worker sees", "", "| worker | CUDA_VISIBLE_DEVICES | devices | name |",
                          "|---|---|---|---|"]
                lines += [f"| {w} | {s['cuda_visible_devices']} | {s['device_count']} | {s['name']} |"
                          for w, s in sorted(step["workers"].items())]
        (self.out / "gpu-check.md").write_text("\n".join(lines) + "\n")
        return ok


def environment() -> Dict[str, Any]:
    import torch

    found: Dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                             "torch CUDA": torch.version.cuda, "host": platform.node()}
    if torch.cuda.is_available():
        found["GPUs"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=driver_version,memory.total,compute_mode", "--format=csv,noheader"]
        found["nvidia-smi"] = subprocess.run(query, capture_output=True, text=True).stdout.strip()
    for module in ("pynvml", "mpi4py", "torchvision", "cuml"):
        try:
            __import__(module)
            found[module] = "present"
        except Exception:
            found[module] = "absent"
    return found


def mnist_nn_pair(check: Check, dataset: str) -> None:
    """mnist_nn with 1 and 4 workers per GPU, and whether they agree."""
    runs = [check.step(f"mnist_nn --dataset {dataset}, --workers-per-gpu {n}", lambda n=n: check.mnist_nn(dataset, n))
            for n in (1, 4)]
    if all(run["status"] == "ok" for run in runs):
        check.step(f"mnist_nn {dataset}: same results with 1 and 4 workers per GPU", lambda: check.same_results(dataset))


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench-results" / "gpu-check", help="report folder")
    parser.add_argument("--smoke", action="store_true", help="(tests) every step on the CPU at toy sizes")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError as error:
        print(f"gpu-check: torch cannot be imported ({error}): nothing checked", file=sys.stderr)
        return 1
    if not args.smoke and not torch.cuda.is_available():
        print(f"gpu-check: no CUDA GPU here (torch {torch.__version__}, built for CUDA {torch.version.cuda or 'none'}):"
              " nothing to check")
        return 0
    check = Check(args.out, args.smoke)
    check.step("pinning: 2 workers per GPU, each reporting what it sees", check.pinning)
    check.step("training: no sync per batch, same seed same bits", check.in_process)
    try:
        from common.data import find_idx_files

        fashion = find_idx_files("fashion-mnist") is not None and not args.smoke
    except Exception:
        fashion = False
    datasets = ["digits"] + (["fashion-mnist"] if fashion else [])
    for dataset in datasets[:1]:
        mnist_nn_pair(check, dataset)
    check.step("bench_nn on CUDA against the reference's style", check.bench_nn)
    check.step("mnist_svm on cuML", check.mnist_svm)
    for dataset in datasets[1:]:
        mnist_nn_pair(check, dataset)
    if not fashion:
        check.step("mnist_nn --dataset fashion-mnist",
                   lambda: {"status": "skipped", "note": "no Fashion-MNIST files found"})
    ok = check.write(environment())
    print(f"gpu-check: {'all steps passed' if ok else 'some steps FAILED'}; report: {args.out / 'gpu-check.md'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
