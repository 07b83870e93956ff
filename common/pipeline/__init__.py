"""GPU pipelines: chains of steps (train -> evaluate -> report) that pass files through a shared
folder, hold GPUs and other resource pools, fall back, retry and resume; many pipelines spread
over every GPU of every node by the engine.

Run ``python -m common.pipeline DEFINITION``; the format is in docs/pipelines.md.
Modules: definition (parse and check), loops (which loops are bounded), flow (walking one
pipeline), steps (one attempt of a step), proctree (a step's processes via /proc), container
(apptainer command line), call (python steps), report (the summary table and the --dry-run plan),
schema (the format as JSON Schema), nodelock (node-wide GPU slots), text (short values in
messages), app (the engine app). The shipped examples are in examples/pipelines/.
"""
from .definition import Pipeline, Step, load_definition, parse_definition
from .flow import PipelineRunner, RunLayout

__all__ = ["Pipeline", "Step", "load_definition", "parse_definition", "PipelineRunner", "RunLayout"]
