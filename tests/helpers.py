"""Running the project's programs for real in tests: plain, or under the venv's own mpiexec."""
from __future__ import annotations

import gzip
import json
import os
import signal
import struct
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, List, Sequence

REPO = Path(__file__).resolve().parents[1]
TOY = str(REPO / "tests" / "toy_app.py")
MPIEXEC = os.path.join(sys.prefix, "bin", "mpiexec")
#: a small mnist_nn run (2 models, 1 candidate, 3 folds, 3 epochs on 600 digits). ``--seed 1763`` with
#: ``--draws keyed`` is chosen (by a search over seeds) because its two candidates are small (1.8M
#: weights at most): a run takes seconds of fitting on a CPU; 3 certainty figures, not 100
NN_SMALL = ["2", "1", "--dataset", "digits", "--subsample", "600", "--max-epochs", "3", "--folds", "3",
            "--seed", "1763", "--draws", "keyed", "--epoch-loss", "mean", "--normalise", "data", "--threads", "1",
            "--gpu", "cpu", "--no-progress", "--certainty-images", "3"]


def command(program: Sequence[str], ranks: int = 1) -> List[str]:
    """``program`` is what follows ``python`` (``["-m", "mnist_svm", ...]`` or a script path)."""
    base = [sys.executable, *program]
    return [MPIEXEC, "-n", str(ranks), *base] if ranks > 1 else base


def run(program: Sequence[str], ranks: int = 1, timeout: float = 240, **kwargs) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run(command(program, ranks), cwd=kwargs.pop("cwd", REPO), env=env, capture_output=True,
                          text=True, timeout=timeout, **kwargs)


def start(program: Sequence[str], ranks: int = 1, **kwargs) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen(command(program, ranks), cwd=kwargs.pop("cwd", REPO), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, **kwargs)


def status_of(results: Path, *flags: str) -> subprocess.CompletedProcess:
    """``python -m common.status RESULTS [flags]``, run to its end."""
    return subprocess.run([sys.executable, "-m", "common.status", str(results), *flags], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def write_idx(path: Path, array: Any, *, compress: bool = False) -> Path:
    """An IDX file as the format defines it (MNIST's): zero, zero, type, ndim, big-endian dims, data."""
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.astype("uint8").tobytes()
    path.write_bytes(gzip.compress(payload) if compress else payload)
    return path


def pipeline_command(definition: Path, results: Path, *extra: str) -> List[str]:
    """The pipeline command line's arguments (after python) on the CPU, a thread per worker, no bar."""
    return ["-m", "common.pipeline", str(definition), "--results", str(results), "--gpu", "cpu", "--threads", "1",
            "--no-progress", *extra]


def write_json(path: Path, value: Any) -> Path:
    """``value`` as JSON in ``path`` (a string as it is: a definition or grid written by hand)."""
    path.write_text(value if isinstance(value, str) else json.dumps(value))
    return path


def pipeline_cli(definition: Path, results: Path, *extra: str, ranks: int = 1,
                 timeout: float = 240) -> subprocess.CompletedProcess:
    """The pipeline command line (:func:`pipeline_command`) run to its end."""
    return run(pipeline_command(definition, results, *extra), ranks=ranks, timeout=timeout)


def generate_script(*args: str, **kwargs: Any) -> subprocess.CompletedProcess:
    """``python -m common.slurm ARGS`` (the batch script generator) run to its end."""
    return subprocess.run([sys.executable, "-m", "common.slurm", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, **kwargs)


def journal_entries(results: Path) -> List[dict]:
    path = Path(results) / "journal.jsonl"
    if not path.exists():
        return []
    entries = []
    for line in path.read_text().splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return entries


def markers(folder: Path) -> Counter:
    """How many times each item ran (each run appends a line to its marker file in ``folder``)."""
    return Counter({p.name: len(p.read_text().splitlines()) for p in Path(folder).iterdir()})


def values(results: Path) -> dict:
    """The toy app's ``values.json`` (every item's value) in ``results``."""
    return json.loads((Path(results) / "values.json").read_text())


def read_summary(results: Path) -> dict:
    """A run's ``summary.json`` in ``results``."""
    return json.loads((Path(results) / "summary.json").read_text())


def wait_until(condition: Callable[[], bool], timeout: float = 60, every: float = 0.05) -> bool:
    """Poll ``condition`` until it holds or ``timeout`` s pass; whether it held."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(every)
    return True


def wait_for_results(results: Path, count: int, timeout: float = 120) -> None:
    """Until the journal holds ``count`` finished items."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sum(1 for e in journal_entries(results) if e.get("type") == "result") >= count:
            return
        time.sleep(0.1)
    raise TimeoutError(f"{results}: fewer than {count} results after {timeout} s")


def rank_pids(results: Path) -> List[int]:
    """Process ids of every rank, from the journal's start record."""
    for entry in reversed(journal_entries(results)):
        if entry.get("type") == "start":
            return [rank["pid"] for rank in entry["layout"]]
    raise LookupError("no start record")


def stop_run(process: subprocess.Popen, results: Path, after: int, sig: int = signal.SIGTERM,
             every_rank: bool = False, timeout: float = 120) -> subprocess.CompletedProcess:
    """Signal rank 0 (or every rank) once ``after`` items are done; wait for the run to end."""
    wait_for_results(results, after)
    pids = rank_pids(results)
    for pid in (pids if every_rank else pids[:1]):
        os.kill(pid, sig)
    out, err = process.communicate(timeout=timeout)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def error_lines(stderr: str) -> List[str]:
    return [line for line in stderr.splitlines() if line.strip()]


def assert_usage_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    """Exit code 2, exactly one line on stderr, no traceback, mentioning ``fragments``."""
    lines = error_lines(proc.stderr)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def snapshot(folder: Path) -> dict:
    """Every file under ``folder`` with its bytes: to prove nothing was written."""
    folder = Path(folder)
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie (an orphan may wait for init to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def kill_frozen(processes: list) -> None:
    """SIGKILL processes that a test froze with SIGSTOP (psutil.Process objects), gone or not."""
    import psutil

    for process in processes:
        try:
            process.kill()
            process.send_signal(signal.SIGCONT)
        except psutil.NoSuchProcess:
            pass


def handler_installed(pid: int, number: int) -> bool:
    """Whether process ``pid`` catches signal ``number`` (its SigCgt mask in /proc)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            caught = next(line for line in status if line.startswith("SigCgt:"))
    except (FileNotFoundError, StopIteration):
        return False
    return bool(int(caught.split()[1], 16) & (1 << (number - 1)))


def stop_signals_deferred(pid: int) -> bool:
    """Whether process ``pid`` has all its early stop handlers (``defer_stop_signals``) in place.
    It installs them one after another, so one caught signal does not say the next is: SIGINT
    is caught by Python from the start, the other three only once deferral is done."""
    return all(handler_installed(pid, number) for number in (signal.SIGUSR1, signal.SIGTERM, signal.SIGUSR2))
