"""``make gpu-check``: one line and exit 0 without a GPU; one line and a failure on a GPU node whose
torch cannot use it; and the whole script on the CPU (--smoke), each step with its criterion."""
from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.api_snapshot import installed_version
from helpers import REPO

#: a stand-in for the driver's nvidia-smi: one H100 in -L and in --query-gpu's CSV
NVIDIA_SMI = """#!/bin/sh
case "$*" in
  *-L*) echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-8f6c2a3e-1b2c-4d5e-8f90-123456789abc)" ;;
  *--query-gpu*) echo "0, NVIDIA H100 80GB HBM3, GPU-8f6c2a3e-1b2c-4d5e-8f90-123456789abc, 81559 MiB, Default, 570.86.15" ;;
  *) echo "NVIDIA-SMI 570.86.15" ;;
esac
"""


def make_gpu_check(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-s", "gpu-check", f"GPU_PYTHON={sys.executable}"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def gpu_node_env(tmp_path, **extra: str) -> dict:
    """PATH with the stand-in nvidia-smi first; outside Slurm, no CUDA_VISIBLE_DEVICES."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(NVIDIA_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_ID")}
    return {**env, "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}", **extra}


def test_without_a_gpu_make_gpu_check_says_so_in_one_line_and_exits_0(tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = make_gpu_check(env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().count("\n") == 0 and "no CUDA GPU here" in proc.stdout, proc.stdout


def test_a_gpu_node_whose_torch_cannot_use_it_fails_make_gpu_check_in_one_line(tmp_path):
    """nvidia-smi lists a GPU that this venv's torch cannot use (a CPU build; or, as make install
    leaves it where PyTorch's CPU index is unreachable, PyPI's CUDA build with no driver here): one
    line saying which torch, built for what, and how to get one that can, and a failure (make adds
    its own status line)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this torch can use a GPU here")
    built = "CPU build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
    proc = make_gpu_check(gpu_node_env(tmp_path))
    assert proc.returncode != 0 and proc.stdout == "", proc.stdout + proc.stderr
    ours = [line for line in proc.stderr.splitlines() if not line.startswith("make")]
    assert len(ours) == 1, proc.stderr
    assert ours[0].startswith("gpu-check: FAILED: the driver lists 1 GPU(s) but torch ") and built in ours[0]
    assert torch.__version__ in ours[0] and "requirements-cu12.txt" in ours[0], ours[0]


def test_a_gpu_hidden_from_the_process_is_no_gpu_here(tmp_path):
    """CUDA_VISIBLE_DEVICES="" on a GPU node: this process was given no GPU, nothing to check, exit 0."""
    proc = make_gpu_check(gpu_node_env(tmp_path, CUDA_VISIBLE_DEVICES=""))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().count("\n") == 0 and "no CUDA GPU here" in proc.stdout and "hidden" in proc.stdout


@pytest.mark.timeout(900)  # 8.5 minutes measured on a shared 2-core machine at load 14
def test_every_step_of_the_check_runs_and_reports_on_the_cpu_with_smoke(tmp_path):
    """The GPU steps at toy sizes on the CPU, from the checkout alone (PYTHONPATH=.): the report is
    written, every step passes (mnist_svm with the fake cuML) or says why it was skipped, and each
    says its criterion."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--smoke", "--out", str(tmp_path / "check")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=880)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "check" / "gpu-check.json").read_text())
    statuses = {step["title"]: step["status"] for step in report["steps"]}
    assert set(statuses.values()) <= {"ok", "skipped"} and statuses, statuses
    assert statuses["mnist_nn digits: same results with 1 and 4 workers per GPU"] == "ok"
    assert statuses["mnist_svm on cuML against scikit-learn"] == "ok"
    assert all(step.get("criterion") for step in report["steps"] if step["status"] == "ok"), report["steps"]
    pinning = next(step for step in report["steps"] if step["title"].startswith("pinning"))
    assert {w: s["cuda_visible_devices"] for w, s in pinning["workers"].items()} == {
        "rank0-gpu0.0": "0", "rank0-gpu0.1": "0", "rank0-gpu1.0": "1", "rank0-gpu1.1": "1"}
    svm = next(step for step in report["steps"] if step["title"].startswith("mnist_svm"))
    assert svm["max_flips"] <= 3 and svm["test_error"] is not None
    markdown = (tmp_path / "check" / "gpu-check.md").read_text()
    assert "| mnist_svm on cuML against scikit-learn | ok |" in markdown and "reference samples/s" in markdown
    # the releases of the GPU stack, as installed here (the fake cuML is only on the step's child's path)
    assert report["environment"]["nvidia-ml-py"] == importlib.metadata.version("nvidia-ml-py")
    assert report["environment"]["cuML"] == (installed_version("cuml") or "absent")
    assert f"- nvidia-ml-py: {importlib.metadata.version('nvidia-ml-py')}" in markdown


def test_pinning_by_uuid_fails_when_a_worker_sees_another_gpu(tmp_path):
    """The GPU pinning criterion on what the workers of two GPUs reported (the smoke run has no
    UUIDs to compare): right, a slot on the other GPU, both GPUs' workers on one GPU, an unknown GPU."""
    from benchmarks.gpu_check import Check

    uuid_a, uuid_b = "GPU-8f6c2a3e-1b2c-4d5e-8f90-123456789abc", "GPU-11111111-2222-3333-4444-555555555555"
    check = Check(tmp_path, smoke=False, physical=["0", "1"], gpus=[{"index": "0", "uuid": uuid_a},
                                                                   {"index": "1", "uuid": uuid_b}])
    torch_view = lambda uuid: uuid.removeprefix("GPU-")  # noqa: E731  (torch's str of the same UUID)
    right = {"rank0-gpu0.0": {"uuid": torch_view(uuid_a)}, "rank0-gpu0.1": {"uuid": torch_view(uuid_a)},
             "rank0-gpu1.0": {"uuid": torch_view(uuid_b)}, "rank0-gpu1.1": {"uuid": torch_view(uuid_b)}}
    assert check._own_gpus(right) == []
    split = {**right, "rank0-gpu0.1": {"uuid": torch_view(uuid_b)}}
    assert any("rank0-gpu0: its workers see different GPUs" in p for p in check._own_gpus(split))
    shared = {w: {"uuid": torch_view(uuid_a)} for w in right}
    assert any("see the same GPU" in p for p in check._own_gpus(shared))
    unknown = {**right, "rank0-gpu1.0": {"uuid": "99999999-0000-0000-0000-000000000000"}}
    assert any("which nvidia-smi does not list" in p for p in check._own_gpus(unknown))


#: ``nvidia-smi -L`` on a node with one GPU in two MIG slices and one whole GPU (R470+ UUID format)
MIG_LISTING = """GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)
  MIG 3g.20gb     Device  0: (UUID: MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f)
  MIG 3g.20gb     Device  1: (UUID: MIG-cba663e8-9bed-5b25-b243-5985ef7c9beb)
GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-11111111-2222-3333-4444-555555555555)
"""


def test_pinning_by_uuid_accepts_the_mig_slices_a_job_was_given():
    """A Slurm job given MIG slices: CUDA_VISIBLE_DEVICES and torch name a slice, which
    ``--query-gpu`` does not list; ``nvidia-smi -L`` does, under its GPU. Workers on two slices of
    one GPU pass; a slice nvidia-smi does not list still fails."""
    from benchmarks.gpu_check import Check, mig_uuids

    slices = mig_uuids(MIG_LISTING)
    assert slices == {"GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77": ["MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f",
                                                                   "MIG-cba663e8-9bed-5b25-b243-5985ef7c9beb"],
                      "GPU-11111111-2222-3333-4444-555555555555": []}
    gpus = [{"index": str(i), "uuid": uuid, "mig_uuids": " ".join(mig)} for i, (uuid, mig) in enumerate(slices.items())]
    slice_a, slice_b = (uuid.removeprefix("MIG-") for uuid in slices[gpus[0]["uuid"]])  # torch's str of them
    check = Check(Path("unused"), smoke=False, physical=[f"MIG-{slice_a}", f"MIG-{slice_b}"], gpus=gpus)
    seen = {"rank0-gpu0.0": {"uuid": slice_a}, "rank0-gpu0.1": {"uuid": slice_a},
            "rank0-gpu1.0": {"uuid": slice_b}, "rank0-gpu1.1": {"uuid": slice_b}}
    assert check._own_gpus(seen) == []
    other = {**seen, "rank0-gpu1.0": {"uuid": "0c0c0c0c-42e4-5de3-91c7-45d71c87eb3f"}}
    assert any("which nvidia-smi does not list" in p for p in check._own_gpus(other))
