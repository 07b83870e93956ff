"""The command line that runs a step inside an Apptainer (or Singularity) image, and the default
image of steps whose definition names none."""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import List, Mapping, Optional, Sequence

from common.results.layout import SHARED_DIR

from .. import settings
from ..errors import UsageError, quoted
from .definition import SHARED_IN_CONTAINER, Step, breaks_bind, resolve_image

#: The image of every step whose definition names none (``--container IMAGE`` wins over it)
CONTAINER_ENV = settings.CONTAINER.name


def find_apptainer(chosen: Optional[str]) -> Optional[str]:
    """``chosen`` (the run's ``PIPELINE_APPTAINER``), else ``apptainer`` or ``singularity`` on PATH, else None."""
    if chosen:
        return shutil.which(chosen)
    return shutil.which("apptainer") or shutil.which("singularity")


def missing_apptainer(chosen: Optional[str]) -> str:
    """Why :func:`find_apptainer` found none: the refusal's words on rank 0, a step's on its node."""
    if chosen:
        return f"PIPELINE_APPTAINER={quoted(chosen)} names no program it can run (a path, or a name on PATH)"
    return "neither apptainer nor singularity is on PATH (or set PIPELINE_APPTAINER)"


def default_image(flag: Optional[str], environ: Mapping[str, str]) -> Optional[str]:
    """The image of steps whose definition names none: ``--container``, else ``PIPELINE_CONTAINER``
    (a file relative to the current folder, or a URI); None when neither is given."""
    where, value = ("--container", flag) if flag is not None else (CONTAINER_ENV, settings.value(settings.CONTAINER, environ))
    if value is None:
        return None
    if not value.strip():
        raise UsageError(f"{where}: the image is empty")
    try:
        return resolve_image(value, Path.cwd())
    except ValueError as error:
        raise UsageError(f"{where}: {error}") from None


def container_command(step: Step, inner: Sequence[str], run_dir: str, apptainer: str,
                      code: Sequence[str] = ()) -> List[str]:
    """``apptainer exec [--nv] [--bind CODE ...] --bind RUN_DIR --bind SHARED:/shared
    --bind host:inside[:ro] ... IMAGE inner...``.

    The run's folder is bound at the same path, so ``$PIPELINE_SHARED`` means the same inside; its
    shared folder is also bound at ``/shared``, where the format's prompts and commands write and
    read (``/shared/checkpoints/model_final.pt``), so nothing lands on the node's own ``/shared``.
    ``--nv`` (NVIDIA driver and libraries) is given to GPU steps. ``code``: folders a python step
    imports from, bound at their own paths before the run's folder (which is often below one of
    them, and stays writable), as apptainer binds $HOME and the current folder (those inside the
    run's folder are already there; one whose name holds a --bind separator cannot be bound); the
    step's mounts come last, and win.
    """
    argv = [apptainer, "exec"]
    if step.gpu:
        argv.append("--nv")
    shared = os.path.join(run_dir, SHARED_DIR)  # RunLayout.shared
    for folder in code:  # first: the run's folder, often below one of them, is bound over them after
        inside_run = os.path.commonpath([folder, run_dir]) == run_dir
        if not inside_run and not breaks_bind(folder):
            argv += ["--bind", f"{folder}:{folder}"]
    argv += ["--bind", f"{run_dir}:{run_dir}", "--bind", f"{shared}:{SHARED_IN_CONTAINER}"]
    for mount in step.mounts:
        argv += ["--bind", f"{mount.host_path}:{mount.container_path}" + (":ro" if mount.readonly else "")]
    return argv + [step.container] + list(inner)
