"""The command line that runs a step inside an Apptainer (or Singularity) image."""
from __future__ import annotations

import shutil
from typing import List, Optional, Sequence

from .. import settings
from .definition import Step

#: Override the program, e.g. a site's wrapper: PIPELINE_APPTAINER=/opt/apptainer/bin/apptainer
APPTAINER_ENV = "PIPELINE_APPTAINER"


def find_apptainer() -> Optional[str]:
    """``$PIPELINE_APPTAINER``, else ``apptainer`` or ``singularity`` on PATH, else None."""
    chosen = settings.value(settings.APPTAINER)
    if chosen:
        return shutil.which(chosen)
    return shutil.which("apptainer") or shutil.which("singularity")


def container_command(step: Step, inner: Sequence[str], run_dir: str, apptainer: str) -> List[str]:
    """``apptainer exec [--nv] --bind RUN_DIR --bind host:inside[:ro] ... IMAGE inner...``.

    The run's folder is bound at the same path, so ``$PIPELINE_SHARED`` means the same
    inside; ``--nv`` (NVIDIA driver and libraries) is given to GPU steps.
    """
    argv = [apptainer, "exec"]
    if step.gpu:
        argv.append("--nv")
    argv += ["--bind", f"{run_dir}:{run_dir}"]
    for mount in step.mounts:
        argv += ["--bind", f"{mount.host_path}:{mount.container_path}" + (":ro" if mount.readonly else "")]
    return argv + [step.container] + list(inner)
