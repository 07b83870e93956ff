"""``make gpu-check``: everything that needs a GPU, in one command, into one report.

PYTHONPATH=. python -m benchmarks.gpu_check [--out DIR] [--smoke]

Meant for a machine with an NVIDIA GPU and a CUDA build of torch where nothing can be installed:
it needs only the checkout (no editable install) and what it and the apps import: torch, numpy,
scikit-learn, matplotlib, Pillow (matplotlib's), psutil, tqdm; nvidia-ml-py (its NVML criterion),
mpi4py, torchvision, cuML and markdown (report.html) where present. This process itself never imports torch nor touches
CUDA (no context on GPU 0 for the whole check, which EXCLUSIVE_PROCESS would refuse to the
workers): torch's view of the GPUs and the training step run in child processes. In under 8
minutes it runs, each step with its own time limit and its own pass criterion, a failure in one
never stopping the others:

- pinning: two workers per GPU report from inside what they see; every worker of every GPU must
  report, see exactly one device, and see its own GPU (CUDA_VISIBLE_DEVICES, and the UUID that
  nvidia-smi gives that GPU);
- training: under torch's sync debug mode, switched on only around each epoch's batch loop, no
  synchronisation there, and exactly two per epoch after it (the epoch's loss and errors); two fits
  with the same seed give the same bits;
- mnist_nn on the GPU on the digits (and on Fashion-MNIST where its files are found) with
  ``--workers-per-gpu 1`` and ``4``: both complete, give identical results, and the NVML monitor
  has samples of every GPU (with memory in use);
- ``benchmarks.bench_nn`` on CUDA against the reference's style (run with ``--workers-per-gpu 4``,
  whose shared-GPU rate it reports): ours must be faster than the reference's style for every model,
  one process each (a single round: bench_nn's speedups vary by about 25% between rounds);
- mnist_svm on cuML where cuML is installed (one line saying it was skipped otherwise), against the
  same run with scikit-learn on the CPU: every fit's validation error within ``SVM_FLIPS`` images.

It writes ``gpu-check.md`` (each step with its criterion and figure) and ``gpu-check.json`` into
``--out`` (default ``bench-results/gpu-check``) and exits 1 if a step failed. Without a GPU it says
so in one line and exits 0; on a GPU node whose torch cannot use the GPU (a CPU build, or a CUDA
build the driver is too old for) it says so in one line and exits 1. ``--smoke`` (for the project's
tests) runs the same steps on the CPU at toy sizes (mnist_svm with the fake cuML of tests/fake_gpu,
pretending a GPU), so the script itself and each criterion are tested where there is no GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from common.app import App
from common.items import Item
from common.results.layout import CV_RESULTS_CSV, RESULTS_CSV, VALIDATION_ERROR_NPY, ResultsLayout

REPO = Path(__file__).resolve().parents[1]
#: the whole check stays under 8 minutes: each step gets at most this, and none starts past the deadline
STEP_SECONDS = 200
DEADLINE_SECONDS = 7 * 60
#: mnist_svm on the digits (600 images, folds of 120): a fit's validation error on cuML (its own
#: solver and kernel, in double precision) may differ from scikit-learn's (libsvm on a precomputed
#: kernel) by at most this many validation images: points on the margin may flip. The criterion is
#: tightest at C 1e-3, gamma 1e-6, where a fifth of the images are misclassified and every decision
#: value is small.
SVM_FLIPS = 3
#: the fake cuML and CuPy that --smoke uses for the mnist_svm step
FAKE_GPU = REPO / "tests" / "fake_gpu"
#: how to get a CUDA torch, for the one-line refusal
CUDA_TORCH_HINT = ("install a CUDA build (pip install -r requirements-cu12.txt --extra-index-url "
                   "https://download.pytorch.org/whl/cu128) or point GPU_PYTHON at a python that has one")
#: the warning torch's sync debug mode gives for each synchronisation (c10/cuda/CUDAFunctions.cpp); not
#: its one-time notice on being switched on, which says it "does not yet detect all synchronizing
#: operations" (counted as a synchronisation, that notice failed this check on an H200)
SYNC_WARNING = "called a synchronizing CUDA operation"
#: what torch sees, printed as JSON by a child process (this one never imports torch)
TORCH_PROBE = """
import json, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torch
    available = torch.cuda.is_available()
print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda, "available": available,
                  "count": torch.cuda.device_count() if available else 0,
                  "warnings": [str(w.message).splitlines()[0] for w in caught]}))
"""


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
                "name": torch.cuda.get_device_name(0) if cuda else None,
                "uuid": str(torch.cuda.get_device_properties(0).uuid) if cuda else None}


def same_uuid(nvidia_smi: str, torch_uuid: Optional[str]) -> bool:
    """nvidia-smi's ``GPU-8f6c...`` and torch's view of the same UUID, compared as hex digits."""
    digits = lambda text: "".join(c for c in (text or "").lower().removeprefix("gpu-") if c in "0123456789abcdef")  # noqa: E731
    return bool(torch_uuid) and digits(nvidia_smi) == digits(torch_uuid)


def nvidia_smi_gpus() -> List[Dict[str, str]]:
    """index, name, uuid, memory and compute mode of each GPU, from nvidia-smi (none without it)."""
    if not shutil.which("nvidia-smi"):
        return []
    fields = ["index", "name", "uuid", "memory.total", "compute_mode", "driver_version"]
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = [dict(zip(fields, (part.strip() for part in line.split(",")))) for line in out.splitlines()
            if line.count(",") == len(fields) - 1]
    slices = mig_uuids()
    for gpu in gpus:
        gpu["mig_uuids"] = " ".join(slices.get(gpu["uuid"], []))
    return gpus


def mig_uuids(listing: Optional[str] = None) -> Dict[str, List[str]]:
    """Each GPU's MIG slices (``MIG-...`` UUIDs) by the GPU's UUID, from ``nvidia-smi -L`` (or its
    ``listing``): on a MIG-partitioned GPU, CUDA_VISIBLE_DEVICES and torch name a slice, and
    ``--query-gpu`` lists only the GPU it belongs to."""
    if listing is None:
        try:
            listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            return {}
    slices: Dict[str, List[str]] = {}
    gpu = None
    for line in listing.splitlines():
        found = re.search(r"\(UUID: ((?:GPU|MIG)-[^)\s]+)\)", line)
        if found is None:
            continue
        if found.group(1).startswith("GPU-") and not line.startswith(" "):
            gpu = found.group(1)
            slices[gpu] = []
        elif gpu is not None and found.group(1).startswith("MIG-"):
            slices[gpu].append(found.group(1))
    return slices


def count_synchronisations(data: Any, index: Any, candidate: Any, epochs: int, init_seed: int = 0) -> Dict[str, int]:
    """Fit on CUDA with torch's sync debug mode on only while each epoch's batch loop
    (``mnist_nn.train.train_epoch``) runs, then again from its end until the epoch's log entry is
    made (the epoch's reads): the synchronisations counted in each, and the epochs run. Set-up (the
    net's and the indexes' upload, the memory check) is not counted."""
    import torch

    from mnist_nn import train

    counts = {"in_batch_loops": 0, "after_batch_loops": 0}
    marks: Dict[str, int] = {}
    inner = train.train_epoch

    def synchronisations(caught: list) -> int:
        return sum(SYNC_WARNING in str(w.message) for w in caught)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        def watched_epoch(*args: Any, **kwargs: Any) -> Any:
            marks["start"] = synchronisations(caught)
            torch.cuda.set_sync_debug_mode("warn")
            try:
                result = inner(*args, **kwargs)
            except BaseException:
                torch.cuda.set_sync_debug_mode("default")
                raise
            marks["end"] = synchronisations(caught)
            counts["in_batch_loops"] += marks["end"] - marks["start"]
            return result  # still watching: the epoch's reads, until on_epoch

        def on_epoch(entry: Dict[str, Any]) -> None:
            torch.cuda.set_sync_debug_mode("default")
            counts["after_batch_loops"] += synchronisations(caught) - marks["end"]

        train.train_epoch = watched_epoch
        try:
            _, log = train.fit(data.x_train, data.y_train, index, candidate, epochs, 10, init_seed=init_seed,
                               on_epoch=on_epoch)
        finally:
            train.train_epoch = inner
            torch.cuda.set_sync_debug_mode("default")
    return {**counts, "epochs": len(log)}


def training_check(smoke: bool) -> Dict[str, Any]:
    """No synchronisation inside an epoch's batch loop and exactly two after it (its loss and its
    errors, read once); the same seed gives the same bits. Run in a child process (``--step
    training``), so CUDA's context lives and dies with it."""
    import numpy as np
    import torch

    from common.data import load_dataset
    from mnist_nn.search import Candidate
    from mnist_nn.train import fit, make_reproducible, to_device

    device = "cpu" if smoke else "cuda"
    if smoke:  # one torch thread, as the smoke's runs (--threads 1): a second only spins on a shared CPU
        torch.set_num_threads(1)
    make_reproducible()  # as the workers of a run
    data = to_device(load_dataset("digits", subsample=400, seed=0), device)
    candidate, index = Candidate(8, 5, 64, 0.01, 0.5), np.arange(100 if smoke else 300)
    result: Dict[str, Any] = {"synchronisations": None}
    if device == "cuda":
        counts = count_synchronisations(data, index, candidate, 2)
        result["synchronisations"] = counts
        expected = {"in_batch_loops": 0, "after_batch_loops": 2 * counts["epochs"]}
        if {k: counts[k] for k in expected} != expected:
            raise AssertionError(f"synchronisations {counts}, expected {expected} ({len(index) // 10} batches an epoch)")
    nets = [fit(data.x_train, data.y_train, index, candidate, 2, 10, init_seed=4)[0] for _ in range(2)]
    if not all(torch.equal(a, b) for a, b in zip(nets[0].state_dict().values(), nets[1].state_dict().values())):
        raise AssertionError("two fits with the same seed differ")
    counts = result["synchronisations"]
    counted = ("not counted: no CUDA" if counts is None else
               f"{counts['in_batch_loops']} synchronisations in {counts['epochs']} epochs' batch loops of "
               f"{len(index) // 10} batches, {counts['after_batch_loops']} after them")
    return {**result, "criterion": "0 syncs in batch loops, 2 per epoch after; same seed, same bits",
            "note": f"same bits twice; {counted}"}


class Check:
    """Runs the steps, records each, and writes the report."""

    def __init__(self, out: Path, smoke: bool, physical: List[str], gpus: List[Dict[str, str]]):
        self.out, self.smoke, self.started = out, smoke, time.monotonic()
        self.physical = physical  # the GPUs this process may use (CUDA_VISIBLE_DEVICES, Slurm, NVML)
        self.gpus = gpus  # nvidia-smi's view: index, name, uuid, ...
        self.steps: List[Dict[str, Any]] = []

    def step(self, title: str, run: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
        if not self.smoke and time.monotonic() - self.started > DEADLINE_SECONDS:  # smoke: every step, however slow
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
        path = env.pop("PYTHONPATH", None) if env else None
        child = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [path, str(REPO), os.environ.get("PYTHONPATH")])),
                     **(env or {}))
        start = time.monotonic()
        proc = subprocess.run([sys.executable, *argv], cwd=REPO, env=child, capture_output=True, text=True,
                              timeout=STEP_SECONDS)
        if proc.returncode != 0:
            raise RuntimeError(f"`{shown}` exited {proc.returncode}: {proc.stderr.strip()[-600:]}")
        return {"command": shown, "wall_seconds": round(time.monotonic() - start, 1), "stdout": proc.stdout}

    # ----- the steps -----
    def mnist_nn(self, dataset: str, workers_per_gpu: int) -> Dict[str, Any]:
        """The default seed's 2 2 on the digits (nets of up to 274M weights), 1 1 on Fashion-MNIST;
        every item done, and NVML samples of every GPU, with memory in use."""
        results = self.out / "runs" / f"mnist_nn-{dataset}-wpg{workers_per_gpu}"
        shutil.rmtree(results, ignore_errors=True)
        size = ["2", "2"] if dataset == "digits" else ["1", "1"]
        if self.smoke:  # two CPU workers stand for the GPU's four
            size = ["1", "1", "--gpu", "cpu", "--workers", str(min(workers_per_gpu, 2)), "--threads", "1",
                    "--max-macs", "1e6", "--subsample", "300", "--max-epochs", "2"]
        else:
            size += ["--gpu", "all", "--workers-per-gpu", str(workers_per_gpu)]
        # no certainty figures: 100 of them take longer than the fits here, and need no GPU
        ran = self.command(["-m", "mnist_nn", *size, "--dataset", dataset, "--certainty-images", "0", "--no-progress",
                            "--results", str(results)])
        summary = json.loads(ResultsLayout(results).summary_json.read_text())
        if summary["items_done"] != summary["items_total"]:
            raise AssertionError(f"{summary['items_done']} of {summary['items_total']} items done")
        usage = summary.get("gpu_usage") or {}
        expected = len(self.physical)
        sampled = {gpu: u for gpu, u in usage.items() if (u.get("samples") or 0) > 0 and (u.get("memory_peak_mib") or 0) > 0}
        if len(sampled) != expected:
            raise AssertionError(f"NVML samples with memory in use for {len(sampled)} GPU(s) of {expected}: {usage}")
        return {"command": ran["command"], "wall_seconds": ran["wall_seconds"], "results": str(results),
                "items_done": summary["items_done"], "item_seconds_total": summary["item_seconds_total"],
                "ensemble_test_error": summary.get("ensemble_test_error"), "gpu_usage": usage,
                "workers": summary.get("workers"),
                "criterion": f"every item done; NVML samples with memory in use for each of the {expected} GPU(s)",
                "note": f"{summary['items_done']} items, ensemble test error {summary.get('ensemble_test_error')}, "
                        f"NVML samples of {len(sampled)} GPU(s)"}

    def same_results(self, dataset: str) -> Dict[str, Any]:
        """--workers-per-gpu 1 and 4 gave the same models (GPUs of one model, deterministic algorithms)."""
        folders = [self.out / "runs" / f"mnist_nn-{dataset}-wpg{n}" for n in (1, 4)]
        same = {name: (folders[0] / name).read_text() == (folders[1] / name).read_text()
                for name in (RESULTS_CSV, CV_RESULTS_CSV)}
        if not all(same.values()):
            raise AssertionError(f"--workers-per-gpu 1 and 4 differ: {same}")
        return {"criterion": "results.csv and cv_results.csv identical", "note": "results.csv and cv_results.csv identical"}

    def pinning(self) -> Dict[str, Any]:
        """Every worker slot of every GPU reported, each saw one device, and it was its own GPU."""
        results = self.out / "runs" / "pinning"
        shutil.rmtree(results, ignore_errors=True)
        physical = ["0", "1"] if self.smoke else self.physical
        env = {"CUDA_VISIBLE_DEVICES": "0,1"} if self.smoke else {}  # smoke: two made-up GPUs
        script = ("from benchmarks.gpu_check import PinningApp; from common.run.runner import main; "
                  "import sys; raise SystemExit(main(PinningApp, sys.argv[1:]))")
        ran = self.command(["-c", script, str(8 * len(physical)), "--gpu", "all", "--workers-per-gpu", "2",
                            "--no-progress", "--results", str(results)], env=env)
        seen = {}
        for line in ResultsLayout(results).journal.read_text().splitlines():
            entry = json.loads(line)
            if entry.get("type") == "result":
                seen.setdefault(entry["worker"], {k: v for k, v in entry["result"].items() if k != "pid"})
        expected = {f"rank0-gpu{i}.{slot}": gpu for i, gpu in enumerate(physical) for slot in (0, 1)}
        problems = [f"{w}: no report" for w in expected if w not in seen]
        for worker, saw in seen.items():
            gpu = expected.get(worker)
            if gpu is None:
                problems.append(f"{worker}: not a worker of this check")
            elif saw["cuda_visible_devices"] != gpu:
                problems.append(f"{worker}: CUDA_VISIBLE_DEVICES={saw['cuda_visible_devices']!r}, not {gpu!r}")
            elif saw["device_count"] != (0 if self.smoke else 1):
                problems.append(f"{worker}: sees {saw['device_count']} devices")
        if not self.smoke and not problems:
            problems += self._own_gpus(seen)
        if problems:
            raise AssertionError("; ".join(problems))
        return {"command": ran["command"], "workers": seen,
                "criterion": "each of 2 workers per GPU reported, saw 1 device, its own GPU (CUDA_VISIBLE_DEVICES; UUID: "
                             "one per GPU, different GPUs different)",
                "note": f"{len(seen)} of {len(expected)} workers on {len(physical)} GPU(s), each its own GPU"}

    def _own_gpus(self, seen: Dict[str, Dict[str, Any]]) -> List[str]:
        """By UUID (whatever order CUDA and nvidia-smi number GPUs in): the workers of one GPU see the
        same GPU, those of different GPUs different ones, each a GPU that nvidia-smi lists."""
        problems, by_gpu = [], {}
        listed = [uuid for gpu in self.gpus for uuid in [gpu["uuid"], *gpu.get("mig_uuids", "").split()]]
        for worker, saw in sorted(seen.items()):
            by_gpu.setdefault(worker.rsplit(".", 1)[0], set()).add(saw.get("uuid"))
            if listed and not any(same_uuid(uuid, saw.get("uuid")) for uuid in listed):
                problems.append(f"{worker}: sees GPU {saw.get('uuid')}, which nvidia-smi does not list")
        problems += [f"{gpu}: its workers see different GPUs {sorted(map(str, u))}" for gpu, u in by_gpu.items()
                     if len(u) != 1]
        seen_once = [next(iter(u)) for u in by_gpu.values() if len(u) == 1]
        if len(set(seen_once)) != len(seen_once):
            problems.append(f"workers of different GPUs see the same GPU: {by_gpu}")
        return problems

    def training(self) -> Dict[str, Any]:
        ran = self.command(["-m", "benchmarks.gpu_check", "--step", "training", *(["--smoke"] if self.smoke else [])])
        return json.loads(ran["stdout"].strip().splitlines()[-1])

    def bench_nn(self) -> Dict[str, Any]:
        """Ours against the reference's style: ours faster for every model (on the CPU: each measured)."""
        report = self.out / "bench_nn.json"
        argv = ["-m", "benchmarks.bench_nn", "--no-run", "--repeats", "1", "--out", str(report)]
        argv += ["--device", "cpu", "--quick"] if self.smoke else ["--device", "cuda", "--workers-per-gpu", "4"]
        ran = self.command(argv)
        fits = json.loads(report.read_text())["fits"]
        speedups = [row["speedup"] for row in fits]
        if not fits or any(not row["ours_samples_per_s"] > 0 for row in fits):
            raise AssertionError(f"bench_nn measured nothing: {fits}")
        if not self.smoke and min(speedups) <= 1:
            raise AssertionError(f"ours is not faster than the reference's style on CUDA: speedups {speedups}")
        return {"command": ran["command"], "table": ran["stdout"], "fits": fits,
                "criterion": "ours faster than the reference's style for every model" if not self.smoke
                else "every model measured (no speed criterion on a shared CPU)",
                "note": "speedups " + ", ".join(f"{s:.1f}x" for s in speedups)}

    def mnist_svm(self) -> Dict[str, Any]:
        """cuML's validation errors against scikit-learn's on the same folds (digits, 600 images)."""
        env: Dict[str, str] = {}
        if self.smoke:  # the fake cuML (scikit-learn under cuML's API) on a pretend GPU
            env = {"PYTHONPATH": str(FAKE_GPU), "CUDA_VISIBLE_DEVICES": "0"}
        else:
            try:
                import importlib.util

                if importlib.util.find_spec("cuml") is None:
                    raise ImportError("cuml")
            except Exception:
                return {"status": "skipped", "note": "cuML is not installed: mnist_svm on the GPU not checked"}
        runs = {}
        for backend, gpu in (("cuml", "all"), ("sklearn", "cpu")):
            results = self.out / "runs" / f"mnist_svm-{backend}"
            shutil.rmtree(results, ignore_errors=True)
            # smoke: the one grid point C 1e-3, gamma 1e-6 (its 5 folds and the refit), where decision
            # values are smallest: the criterion at its tightest
            ran = self.command(["-m", "mnist_svm", "1" if self.smoke else "3", "--dataset", "digits", "--subsample", "600",
                                "--gpu", gpu,
                                "--no-progress", "--results", str(results)], env=dict(env))
            runs[backend] = {**ran, "results": results,
                             "summary": json.loads(ResultsLayout(results).summary_json.read_text())}
        import numpy as np

        if runs["cuml"]["summary"].get("backend") != "cuml":
            raise AssertionError(f"the GPU run fitted with {runs['cuml']['summary'].get('backend')}, not cuML")
        errors = {b: np.load(run["results"] / VALIDATION_ERROR_NPY) for b, run in runs.items()}
        flips = float(np.max(np.abs(errors["cuml"] - errors["sklearn"]))) * (600 // 5)
        if not flips <= SVM_FLIPS + 1e-9:
            raise AssertionError(f"a fit's validation error differs by {flips:.0f} images between cuML and scikit-learn "
                                 f"(at most {SVM_FLIPS})")
        summary = runs["cuml"]["summary"]
        return {"command": runs["cuml"]["command"], "wall_seconds": runs["cuml"]["wall_seconds"],
                "item_seconds_total": summary["item_seconds_total"], "test_error": summary.get("test_error"),
                "sklearn_test_error": runs["sklearn"]["summary"].get("test_error"), "max_flips": flips,
                "gpu_usage": summary.get("gpu_usage", {}),
                "criterion": f"each fit's validation error within {SVM_FLIPS} of 120 images of scikit-learn's",
                "note": f"largest difference {flips:.0f} images; test error {summary.get('test_error')} (cuML) vs "
                        f"{runs['sklearn']['summary'].get('test_error')} (scikit-learn)"}

    # ----- the report -----
    def write(self, environment: Dict[str, Any]) -> bool:
        ok = all(step["status"] != "failed" for step in self.steps)
        report = {"ok": ok, "smoke": self.smoke, "environment": environment, "steps": self.steps}
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "gpu-check.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
        lines = [f"# make gpu-check{' (--smoke: on the CPU, toy sizes)' if self.smoke else ''}", "",
                 *[f"- {key}: {value}" for key, value in environment.items()], "",
                 "| step | status | seconds | criterion | figure |", "|---|---|---|---|---|"]
        for step in self.steps:
            # a failure's last line says why (a child's stderr ends with its exception, not starts)
            error = (step.get("error") or "").strip().splitlines()
            note = step.get("note") or (error[-1] if error else "") or step.get("command", "")
            lines.append(f"| {step['title']} | {step['status']} | {step.get('seconds', '')} | "
                         f"{str(step.get('criterion', '')).replace('|', '/')} | {str(note).replace('|', '/')[:300]} |")
        for step in self.steps:
            if step.get("gpu_usage"):
                lines += ["", f"## NVML samples: {step['title']}", "", "| GPU | samples | util mean % | util peak % "
                          "| memory peak MiB |", "|---|---|---|---|---|"]
                lines += [f"| {gpu} | {u.get('samples')} | {u.get('util_mean_percent')} | {u.get('util_peak_percent')} "
                          f"| {u.get('memory_peak_mib')} |" for gpu, u in step["gpu_usage"].items()]
            if step.get("table"):
                lines += ["", f"## {step['title']}", "", step["table"].strip()]
            if step.get("workers") and step["title"].startswith("pinning"):
                lines += ["", "## What each worker sees", "", "| worker | CUDA_VISIBLE_DEVICES | devices | name | UUID |",
                          "|---|---|---|---|---|"]
                lines += [f"| {w} | {s['cuda_visible_devices']} | {s['device_count']} | {s['name']} | {s.get('uuid')} |"
                          for w, s in sorted(step["workers"].items())]
        (self.out / "gpu-check.md").write_text("\n".join(lines) + "\n")
        return ok


def probe_torch() -> Dict[str, Any]:
    """What torch sees of CUDA, asked in a child process (CUDA's state lives and dies there)."""
    proc = subprocess.run([sys.executable, "-c", TORCH_PROBE], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        raise ImportError(lines[-1] if lines else f"exit {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def environment(torch_seen: Dict[str, Any], gpus: List[Dict[str, str]]) -> Dict[str, Any]:
    import importlib.util

    found: Dict[str, Any] = {"python": platform.python_version(), "torch": torch_seen["torch"],
                             "torch CUDA": torch_seen["cuda"], "host": platform.node()}
    if gpus:
        found["GPUs"] = [f"{g['index']}: {g['name']}, {g['memory.total']}, {g['compute_mode']}" for g in gpus]
        found["driver"] = gpus[0].get("driver_version")
    from benchmarks.api_snapshot import installed_version

    # the releases, not only their presence: what a report of a failure needs first
    for label, module, package in (("nvidia-ml-py", "pynvml", "nvidia-ml-py"), ("mpi4py", "mpi4py", "mpi4py"),
                                   ("torchvision", "torchvision", "torchvision"), ("cuML", "cuml", "cuml"),
                                   ("CuPy", "cupy", "cupy")):
        if importlib.util.find_spec(module) is None:
            found[label] = "absent"
        else:
            found[label] = installed_version(package) or "present (no package metadata)"
    return found


def mnist_nn_pair(check: Check, dataset: str) -> None:
    """mnist_nn with 1 and 4 workers per GPU, and whether they agree."""
    runs = [check.step(f"mnist_nn --dataset {dataset}, --workers-per-gpu {n}", lambda n=n: check.mnist_nn(dataset, n))
            for n in (1, 4)]
    if all(run["status"] == "ok" for run in runs):
        check.step(f"mnist_nn {dataset}: same results with 1 and 4 workers per GPU", lambda: check.same_results(dataset))


def refusal(torch_seen: Dict[str, Any]) -> Optional[tuple]:
    """(exit code, line) where this machine cannot be checked: 0 without a GPU; 1 where the driver
    lists GPUs that this process may use but torch cannot use them."""
    from common.devices import node_gpus, visible_gpus

    if torch_seen["available"]:
        return None
    build = f"torch {torch_seen['torch']} (built for CUDA {torch_seen['cuda'] or 'none: a CPU build'})"
    on_node = node_gpus()
    if not on_node:
        return 0, f"gpu-check: no CUDA GPU here ({build}): nothing to check"
    if not visible_gpus():
        return 0, (f"gpu-check: no CUDA GPU here for this process: the node's {len(on_node)} GPU(s) are hidden "
                   f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}): nothing to check")
    why = "; ".join(torch_seen.get("warnings") or [])
    return 1, (f"gpu-check: FAILED: the driver lists {len(on_node)} GPU(s) but {build} cannot use them"
               + (f" ({why})" if why else "") + f": {CUDA_TORCH_HINT}")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench-results" / "gpu-check", help="report folder")
    parser.add_argument("--smoke", action="store_true", help="(tests) every step on the CPU at toy sizes")
    parser.add_argument("--step", choices=["training"], help=argparse.SUPPRESS)  # a step's child process
    args = parser.parse_args(argv)
    if args.step == "training":
        print(json.dumps(training_check(args.smoke), default=str))
        return 0
    try:
        torch_seen = probe_torch()
    except (ImportError, ValueError, OSError, subprocess.SubprocessError) as error:
        print(f"gpu-check: torch cannot be imported ({error}): nothing checked", file=sys.stderr)
        return 1
    if not args.smoke:
        refused = refusal(torch_seen)
        if refused is not None:
            code, line = refused
            print(line, file=sys.stderr if code else sys.stdout)
            return code
    from common.devices import visible_gpus

    gpus = [] if args.smoke else nvidia_smi_gpus()
    check = Check(args.out, args.smoke, [] if args.smoke else visible_gpus(), gpus)
    check.step("pinning: 2 workers per GPU, each reporting what it sees", check.pinning)
    check.step("training: no sync per batch, same seed same bits", check.training)
    try:
        from common.data import find_idx_files

        fashion = find_idx_files("fashion-mnist") is not None and not args.smoke
    except Exception:
        fashion = False
    datasets = ["digits"] + (["fashion-mnist"] if fashion else [])
    for dataset in datasets[:1]:
        mnist_nn_pair(check, dataset)
    check.step("bench_nn on CUDA against the reference's style", check.bench_nn)
    check.step("mnist_svm on cuML against scikit-learn", check.mnist_svm)
    for dataset in datasets[1:]:
        mnist_nn_pair(check, dataset)
    if not fashion:
        check.step("mnist_nn --dataset fashion-mnist",
                   lambda: {"status": "skipped", "note": "no Fashion-MNIST files found"})
    ok = check.write(environment(torch_seen, gpus))
    print(f"gpu-check: {'all steps passed' if ok else 'some steps FAILED'}; report: {args.out / 'gpu-check.md'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
