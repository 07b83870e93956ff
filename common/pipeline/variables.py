"""The ``PIPELINE_*`` variables the engine gives each attempt of a step (the pipeline format's
names): the code's one spelling of them, for the runner that sets them, the step launcher that
reads some back and ``common.pipeline.call`` inside the step (help texts and the schema's
descriptions name them in words). The engine's own settings are ``common.settings``'s."""
from __future__ import annotations

from pathlib import Path
from typing import Dict

NAME = "PIPELINE_NAME"
RUN_ID = "PIPELINE_RUN_ID"
RUN_DIR = "PIPELINE_RUN_DIR"
SHARED = "PIPELINE_SHARED"
STEP_ID = "PIPELINE_STEP_ID"
STEP_DIR = "PIPELINE_STEP_DIR"
ATTEMPT = "PIPELINE_ATTEMPT"
SEED = "PIPELINE_SEED"
LAUNCH_DIR = "PIPELINE_LAUNCH_DIR"
DEFINITION_DIR = "PIPELINE_DEFINITION_DIR"
#: a prompt step's only: its model and its tools (comma-separated), for the agent
MODEL = "PIPELINE_MODEL"
TOOLS = "PIPELINE_TOOLS"


def step_variables(*, name: str, run_id: str, run_dir: Path, shared: Path, step_id: str, step_dir: Path,
                   attempt: int, seed: int, launch_dir: Path, definition_dir: Path) -> Dict[str, str]:
    """The variables of one attempt of a step (the folders as absolute paths)."""
    return {NAME: name, RUN_ID: run_id, RUN_DIR: str(Path(run_dir).resolve()), SHARED: str(Path(shared).resolve()),
            STEP_ID: step_id, STEP_DIR: str(Path(step_dir).resolve()), ATTEMPT: str(attempt), SEED: str(seed),
            LAUNCH_DIR: str(launch_dir), DEFINITION_DIR: str(definition_dir)}
