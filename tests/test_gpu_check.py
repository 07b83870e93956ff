"""``make gpu-check``: one line and exit 0 without a GPU; and the whole script on the CPU (--smoke)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from helpers import REPO


def test_without_a_gpu_make_gpu_check_says_so_in_one_line_and_exits_0(tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(["make", "-s", "gpu-check", f"GPU_PYTHON={sys.executable}"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().count("\n") == 0 and "no CUDA GPU here" in proc.stdout, proc.stdout


def test_every_step_of_the_check_runs_and_reports_on_the_cpu_with_smoke(tmp_path):
    """The GPU steps at toy sizes on the CPU, from the checkout alone (PYTHONPATH=.): the report is
    written, every step passes or says why it was skipped."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--smoke", "--out", str(tmp_path / "check")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "check" / "gpu-check.json").read_text())
    statuses = {step["title"]: step["status"] for step in report["steps"]}
    assert set(statuses.values()) <= {"ok", "skipped"} and statuses, statuses
    assert statuses["mnist_nn digits: same results with 1 and 4 workers per GPU"] == "ok"
    pinning = next(step for step in report["steps"] if step["title"].startswith("pinning"))
    assert {w: s["cuda_visible_devices"] for w, s in pinning["workers"].items()} == {
        "rank0-gpu0.0": "0", "rank0-gpu0.1": "0", "rank0-gpu1.0": "1", "rank0-gpu1.1": "1"}
    markdown = (tmp_path / "check" / "gpu-check.md").read_text()
    assert "| mnist_svm on cuML | skipped |" in markdown and "reference samples/s" in markdown
