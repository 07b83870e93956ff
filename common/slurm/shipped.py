"""The batch scripts checked in under ``slurm/``: each one a generator command line.

Regenerate them all with ``python -m common.slurm --shipped slurm``; a test checks that the
files are what the generator makes, so the template stays the one source of truth.
"""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Dict, List

from ..errors import UsageError, quoted

#: pipeline definition the pipeline scripts run unless given another on the sbatch line
PIPELINE_FILE = "examples/pipelines/sweep.json"

_GPU_NODE = "--gpus-per-node 4"

#: file name -> generator arguments (everything after ``python -m common.slurm``)
SHIPPED: Dict[str, str] = {
    # one node with all its GPUs
    "mnist_svm-1node.sbatch": f"--nodes 1 {_GPU_NODE} --time 24:00:00 -- mnist_svm 24 --batch 50",
    "mnist_nn-1node.sbatch": f"--nodes 1 {_GPU_NODE} --time 48:00:00 -- mnist_nn 12 12",
    "pipeline-1node.sbatch": f"--nodes 1 {_GPU_NODE} --time 12:00:00 -- common.pipeline {PIPELINE_FILE}",
    # several nodes, one rank per node driving all of that node's GPUs
    "mnist_svm-4nodes.sbatch": f"--nodes 4 {_GPU_NODE} --time 12:00:00 -- mnist_svm 24 --batch 50",
    "mnist_nn-4nodes.sbatch": f"--nodes 4 {_GPU_NODE} --time 24:00:00 -- mnist_nn 12 12",
    "pipeline-4nodes.sbatch": f"--nodes 4 {_GPU_NODE} --time 12:00:00 -- common.pipeline {PIPELINE_FILE}",
    # the same in an Apptainer image (hybrid model: srun outside, MPI inside the container)
    "mnist_svm-4nodes-apptainer.sbatch":
        f"--nodes 4 {_GPU_NODE} --time 12:00:00 --container multinode-gpu-cu12.sif -- mnist_svm 24 --batch 50",
    # CPU variants: two ranks on one node, for laptops, CPU clusters and the project's tests
    "mnist_svm-cpu.sbatch": "--nodes 1 --cpu --ntasks-per-node 2 --time 02:00:00 -- mnist_svm 4 --dataset digits",
    # --max-macs: the reference's draws on the digits include a net of 274M weights, hours of CPU for one fit
    "mnist_nn-cpu.sbatch": "--nodes 1 --cpu --ntasks-per-node 2 --time 02:00:00 -- mnist_nn 2 2 --dataset digits "
                           "--max-macs 3e5",
    "pipeline-cpu.sbatch": f"--nodes 1 --cpu --ntasks-per-node 2 --time 02:00:00 -- common.pipeline {PIPELINE_FILE}",
}


def shipped_scripts() -> Dict[str, str]:
    """File name -> script text, as the generator makes them now."""
    from .arguments import build_parser, spec_from_args
    from .template import render

    scripts = {}
    for name, line in SHIPPED.items():
        words: List[str] = shlex.split(line)
        split = words.index("--")
        args = build_parser().parse_args(words[:split])
        scripts[name] = render(spec_from_args(args, words[split + 1:]))
    return scripts


def write_shipped(folder: Path) -> List[Path]:
    """Write every shipped script into ``folder``; returns the paths written.

    A folder that cannot be made or written (a file of that name, no permission) is a UsageError.
    """
    folder = Path(folder)
    scripts = shipped_scripts()
    written = []
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in scripts.items():
            path = folder / name
            path.write_text(text)
            path.chmod(0o755)
            written.append(path)
    except OSError as error:
        raise UsageError(f"--shipped {quoted(folder)}: cannot write {quoted(error.filename or folder)}: "
                         f"{error.strerror or error}") from None
    return written
