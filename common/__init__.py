"""multinode-gpu's engine: MPI ranks x spawned per-GPU workers, dynamic distribution, journal, resume.

Layers, lowest first; a module imports its own layer and those below it, never one above
(tests/test_layers.py checks it):
  (package root)  the contract and the foundations every layer may use:
                  app.py (App, RunInfo, Record), items.py (items and their seeds), errors.py,
                  messages.py (the typed records between processes), devices.py (--gpu, Device),
                  settings.py (every environment variable and default), signals.py (the stop signals
                  and their handling), startup.py (stdout/stderr that cannot make a run fail),
                  clock.py (the clock loops are given), linux.py (prctl: children that die with
                  their parent), argtypes.py (argparse types: a number in a range, a folder),
                  userfile.py (the JSON and YAML files users write), data.py (the apps' data sets)
  results/        the results folder: layout (every name in it), journal, hold, outputs, write
                  failures, status.json, safe reads of the run's own files
  observe/        what users see: progress, logs, GPU monitor and plot, timeline, report.html
  workers/        a rank's spawned workers: pool, worker process, watchdog, placement, resource pools,
                  what the app's code leaves running (leftovers), whether workers can import it (spawnable)
  ranks/          MPI ranks: the world, leader and followers, liveness, rank 0's scheduler
  run/            the program: the engine's flags (cli), main(AppClass) (runner) and the run itself (engine)
  on top          status.py (python -m common.status), pipeline/, sweep/, slurm/, testing/

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
    "check_range": "app", "percent": "app", "resumed_note": "app",
    "UsageError": "errors", "ItemFailed": "errors", "counted": "errors", "main": "run.runner", "Device": "devices",
    "defer_stop_signals": "signals",
    "at_least": "argtypes", "REFERENCE_SEED": "run.cli",
    # writing outputs (outputs.py): atomic, so a crash never leaves half a file
    "atomic_write_bytes": "results.outputs", "atomic_write_json": "results.outputs", "atomic_write_text": "results.outputs",
    "atomic_write_with": "results.outputs",
    "new_figure": "results.outputs", "save_figure": "results.outputs", "FIGURE_FORMATS": "results.outputs",
    "FIGURE_SET_FORMATS": "results.outputs",
    # the shared data sets (data.py)
    "Dataset": "data", "load_dataset": "data", "resize_images": "data", "add_data_arguments": "data",
    "check_available": "data", "check_data_flags": "data", "ensure_available": "data", "OFFLINE": "data",
}
__all__ = list(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
