"""GPU pipelines: chains of steps (train -> evaluate -> report) that pass files through a shared
folder, hold GPUs and other resource pools, fall back, retry and resume; many pipelines spread
over every GPU of every node by the engine.

Run ``python -m common.pipeline DEFINITION``; the format is in docs/pipelines.md.
Modules: definition (parse and check), loops (which loops are bounded), flow (walking one
pipeline), steps (one attempt of a step), proctree (a step's processes via /proc), container
(apptainer command line), call (python steps), report (the summary table and the --dry-run plan),
schema (the format as JSON Schema), nodelock (node-wide GPU slots), sizes (memory sizes as written),
guard (the small program that ends a step with its worker), variables (the PIPELINE_* variables a step
is given), app (the engine app). The shipped examples are in examples/pipelines/.

On top of the engine: may import every layer below it (the package root, results/, observe/,
workers/, ranks/, run/); nothing below imports it, and of the other packages on top only slurm/
does (the pipeline definitions a batch script runs).

Importing the package imports nothing heavy (each name below on first use), so that ``python -m
common.pipeline`` defers stop signals (``common.signals``) before the slow imports start.
"""
from typing import Any

_WHERE = {"Pipeline": "definition", "Step": "definition", "load_definition": "definition",
          "parse_definition": "definition", "PipelineRunner": "flow", "RunLayout": "flow"}
__all__ = list(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
