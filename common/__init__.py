"""multinode-gpu's engine: MPI ranks x spawned per-GPU workers, dynamic distribution, journal, resume.

Layout (one concept a module):
  app.py          the contract an application implements (App, RunInfo, Record)
  items.py        work items and their seeds
  runner.py       main(AppClass): command line -> validation -> distribution -> outputs
  signals.py      the stop signals and their handling (deferred while a program still imports)
  startup.py      stdout and stderr that a closed pipe or a full disk cannot make fail
  layout.py       every name in a results folder (ResultsLayout)
  cli.py          the engine's flags; bad input as one line, exit code 2
  devices.py      --gpu parsing and GPU discovery without initialising CUDA
  mpi.py          the rank's MPI world (imported on the rank's main path only)
  distribute.py   rank 0 leads, other ranks follow: the request/result protocol
  liveness.py     heartbeats between ranks: rank 0's watch over its followers, the ranks it lost
  scheduler.py    rank 0's bookkeeping: ready, running, retried, failed; waves
  worker_pool.py  a rank's spawned workers: pinning, death detection, replacement
  worker.py       the worker process itself, and acquire() for resource pools
  watchdog.py     kills a rank's silent workers and those whose item ran past --item-timeout
  resources.py    named resource pools (counting semaphores)
  clock.py        the clock the engine's loops are given (the time module; tests give a simulated one)
  journal.py      the append-only journal that makes --resume possible
  progress.py, timeline.py, gpu_monitor.py, outputs.py, logs.py   what users see
  status_file.py  status.json, rewritten by rank 0 every few seconds; status.py reads it (python -m common.status)
  gpu_usage.py, report_html.py   gpu_usage.png/.csv and report.html at the end of a run
  data.py         MNIST / Fashion-MNIST / digits loading shared by the apps
  pipeline/       train -> evaluate -> report pipelines on the engine
  sweep/          your own function over a grid, a list or random samples (sweep.main, python -m common.sweep)
  slurm/          sbatch script generator

Importing the package imports nothing heavy (each name below is imported on first use), so
an app's ``__main__`` can defer stop signals (``common.signals``) before the slow imports start.
"""
from typing import Any

#: The app-facing API: everything an application needs, importable from ``common`` itself. The
#: other modules are the engine's internals (their layout above may change between versions).
_WHERE = {
    # the contract (app.py, items.py, errors.py) and the entry point
    "App": "app", "Record": "app", "RunInfo": "app", "check_fields": "app", "NUMBER": "app",
    "NUMBER_OR_NONE": "app", "Item": "items", "item_seed": "items", "torch_seed": "items", "seed32": "items",
    "UsageError": "errors", "main": "runner", "Device": "devices", "defer_stop_signals": "signals",
    "at_least": "cli", "REFERENCE_SEED": "cli",
    # writing outputs (outputs.py): atomic, so a crash never leaves half a file
    "atomic_write_bytes": "outputs", "atomic_write_json": "outputs", "atomic_write_text": "outputs",
    "new_figure": "outputs", "save_figure": "outputs",
    # the shared data sets (data.py)
    "Dataset": "data", "load_dataset": "data", "resize_images": "data", "add_data_arguments": "data",
    "check_available": "data", "check_data_flags": "data", "ensure_available": "data",
}
__all__ = list(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
