"""The program a batch script runs, checked on the login node before the script is printed.

A job that fails on its first line after a day in the queue is the costliest kind of typo, so
the generator runs the app's own argument checks (its parser and ``App.check_arguments``: the
values alone, no data loaded, no device looked at) and checks the files the job names: a
pipeline definition (read and checked as the pipeline runner does), the container image, a
``.py`` script. Paths are relative to the current folder, the job's submit folder.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import shlex
import stat
import sys
from pathlib import Path
from typing import Dict, List, Optional

from ..errors import UsageError, quoted

#: the apps the project ships: module -> "module:class" of their App
KNOWN_APPS: Dict[str, str] = {
    "mnist_svm": "mnist_svm.app:MnistSvm",
    "mnist_nn": "mnist_nn.app:MnistNN",
    "common.pipeline": "common.pipeline.app:PipelineApp",
    "common.sweep": "common.sweep.app:SweepApp",
}


def resume_takes_target(target: str) -> bool:
    """Whether the program's --resume takes a value (an App with ``resume_target``: the pipelines'
    RUN_ID/STEP_ID) rather than being a flag; False for a script or a user's own module."""
    return target in KNOWN_APPS and bool(_app_class(target).resume_target)


def _is_file(path: object, what: str) -> bool:
    """Whether ``path`` is a file; a path the filesystem refuses to look up (a name over its limit,
    no permission) is a UsageError naming ``what``."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as error:
        raise UsageError(f"{what} {quoted(path)}: cannot be read ({error.strerror or error})") from None


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package that is missing or fails to import
        return False


def _app_class(target: str) -> Optional[type]:
    """The App class of a shipped app, or None for another module that can be imported here
    (a user's own app: its checks run when the job starts); an unknown name is a UsageError."""
    if target in KNOWN_APPS:
        module, _, name = KNOWN_APPS[target].partition(":")
        return getattr(importlib.import_module(module), name)
    if _module_exists(target):
        return None
    raise UsageError(f"unknown app {target!r}: expected one of {', '.join(KNOWN_APPS)}, another module that "
                     f"can be imported here, or a .py file")


def check_program(command: List[str], cpu_job: bool = False) -> Optional[argparse.Namespace]:
    """Refuse, as the app itself would, a program whose arguments or files are wrong; in a CPU job
    (``cpu_job``), one told to use GPUs (its nodes have none for it). Returns a shipped app's
    parsed arguments (None for a script or a user's module)."""
    from common.run.cli import build_parser

    from ..devices import check_workers_on_gpus, check_workers_per_gpu, names_cpu, parse_gpu_spec

    target = command[0]
    if target.endswith(".py"):
        if not _is_file(target, "the program"):
            raise UsageError(f"{quoted(target)}: no such file (the job runs it from this folder)")
        return None
    app_class = _app_class(target)
    if app_class is None:
        return None
    try:
        args = build_parser(app_class, quiet=True).parse_args(command[1:])
    except SystemExit:  # --help: the job would print its help and end
        raise UsageError(f"{target} --help: the job would only print its help; "
                         f"see python -m {target} --help here") from None
    except UsageError as error:
        raise UsageError(f"{target}: {error}") from None
    try:
        if args.gpu is not None:
            parse_gpu_spec(args.gpu)  # the form only: the compute nodes' GPUs are not visible here
            if cpu_job and not names_cpu(args.gpu):
                raise UsageError(f"--gpu {args.gpu}: a CPU job (--cpu) is given no GPU; use --gpu cpu, or a GPU job")
            if not cpu_job and names_cpu(args.gpu):
                raise UsageError(f"--gpu {args.gpu} in a GPU job: the GPUs it asks for would sit idle; use --cpu for "
                                 f"a CPU job, or --gpu all")
        # a CPU job's script adds --gpu cpu when it starts, a GPU job's --gpu all
        check_workers_per_gpu("cpu" if cpu_job else args.gpu, getattr(args, "workers_per_gpu", 1))
        if not cpu_job:
            check_workers_on_gpus(args.gpu or "all", getattr(args, "workers", 1))
        app = app_class(args)
        app.check_arguments()
        own = app.fingerprint() if target in ("mnist_svm", "mnist_nn") else None  # from their arguments alone
        if target == "common.pipeline":
            from ..pipeline.app import parse_resume_target, pipelines_fingerprint

            pipelines = _check_definition(args.definition, getattr(args, "container", None))
            parse_resume_target(args.resume, pipelines)  # --resume RUN_ID/STEP_ID names one of them
            own = pipelines_fingerprint(pipelines)
        if target == "common.sweep":
            app.check_before_the_queue()
        from common.run.engine import results_folder_refusal  # the job starts with --resume: this folder's run

        refusal = results_folder_refusal(app, own)
        if refusal:
            raise UsageError(refusal)
    except UsageError as error:
        raise UsageError(f"{target}: {error}") from None
    return args


def data_note(args: Optional[argparse.Namespace], container: Optional[str] = None) -> Optional[str]:
    """For a shipped app whose data set is not in this folder (the job's, as it is submitted from
    here): the job will download it on its first node, after the wait in the queue, and many
    clusters' compute nodes have no internet. Said, not refused: they may have it, or the files
    may be where only they look. ``args``: what :func:`check_program` returned. In a container
    (``container``), a --data-dir is the container's path, not this host's: not looked at."""
    from ..data import find_idx_files, reference_download_dir

    if args is None:
        return None
    name, data_dir = getattr(args, "dataset", None), getattr(args, "data_dir", None)
    if name in (None, "digits") or (container and data_dir is not None) or find_idx_files(name, data_dir) is not None:
        return None
    where = quoted(str(data_dir)) if data_dir is not None else f"data/ (or the reference's ./{reference_download_dir(name)})"
    return (f"{name}: its files are not in {where} here; the job would download them on its first node, which "
            f"needs the internet there; where compute nodes have none, download them here first: "
            f"python -m common.data download {shlex.quote(name)} {shlex.quote(str(data_dir or 'data'))}")


def venv_note(venv: Optional[str], container: Optional[str] = None) -> Optional[str]:
    """The job sources ``venv``/bin/activate in the folder it is submitted from (this one); where
    there is none, it runs the python on the PATH that sbatch hands it, whatever environment was
    active when the job was submitted: a user's own folder (a sweep of their module, which must
    be submitted from there) has no .venv. Said, not refused: that PATH may well be right."""
    if not venv or container or (Path(venv) / "bin" / "activate").is_file():
        return None
    here = sys.prefix if sys.prefix != sys.base_prefix else None  # the virtual environment running this
    fix = (f"give --venv {shlex.quote(here)} (the one running this)" if here else
           "give --venv PATH, or --venv none where the job's PATH has the Python and packages to use")
    return (f"--venv {venv}: no virtual environment there from this folder, where the job starts; it would run the "
            f"python on the PATH it is submitted with; {fix}")


def uri_note(image: Optional[str]) -> Optional[str]:
    """An image given as a URI (``docker://...``): each node's apptainer asks the registry for it at
    every start of the job and, where its cache (``$HOME/.apptainer/cache``, Apptainer's docs) does
    not hold it yet, pulls and converts it, on every node at once at the first start; a registry's
    pull limits apply. Said, not refused: it works."""
    if image is None or "://" not in image:
        return None
    return (f"--container {image}: every node's apptainer asks the registry for it at each start of the job, and "
            f"the first start pulls and converts it on all nodes at once; build it once here instead (apptainer "
            f"build image.sif {shlex.quote(image)}) and give --container image.sif")


def _check_definition(path: Path, container: Optional[str]) -> list:
    """The pipeline definition exists and passes the runner's own checks of its format, with the
    default image the job would give steps that name none (the program's --container, else
    PIPELINE_CONTAINER)."""
    from ..pipeline.container import default_image
    from ..pipeline.definition import load_definition

    if not _is_file(path, "the pipeline definition"):
        raise UsageError(f"{quoted(path)}: no such pipeline definition")
    return load_definition(path, default_image=default_image(container, os.environ))


#: what every Apptainer (and Singularity) sandbox folder holds
SANDBOX_MARK = ".singularity.d"


def check_container(image: Optional[str]) -> None:
    """The Apptainer image exists: a file (.sif), or a sandbox folder (``apptainer build --sandbox``);
    a ``docker://``-style URI is fetched by apptainer itself."""
    if image is None or "://" in image:
        return
    if os.path.isdir(image):
        if not os.path.isdir(os.path.join(image, SANDBOX_MARK)):
            raise UsageError(f"--container {quoted(image)}: a folder, but not an Apptainer sandbox image (it has no "
                             f"{SANDBOX_MARK})")
        return
    if not _is_file(image, "--container"):
        raise UsageError(f"--container {quoted(image)}: no such image file (relative paths are from this folder, "
                         f"where the job starts)")
