"""The generator's arguments: its parser, and the job they describe (used by ``__main__`` and by
``shipped``, which regenerates the checked-in scripts)."""
from __future__ import annotations

import argparse
from typing import List

from ..argtypes import OneLineParser, folder
from .spec import MPI_PLUGINS, JobSpec, parse_gpus


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m common.slurm",
                     description="Print a walltime-safe Slurm batch script for a multinode-gpu program "
                                 "(everything after '--' is the program and its arguments).")
    parser.add_argument("--nodes", type=int, default=1, help="nodes, one MPI rank each (default 1)")
    parser.add_argument("--gpus-per-node", default=None, metavar="[TYPE:]N",
                        help="GPUs per node, or TYPE:N for a GPU type the cluster names (a100:4); the rank uses "
                             "them all (a GPU job needs it; or --cpu)")
    parser.add_argument("--time", default="01:00:00", help="walltime in any of sbatch's forms: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS "
                             "(default 01:00:00)")
    parser.add_argument("--partition", help="Slurm partition")
    parser.add_argument("--account", help="Slurm account to charge")
    parser.add_argument("--container", metavar="IMAGE", help="run the program in this Apptainer image (apptainer exec --nv IMAGE)")
    parser.add_argument("--bind", action="append", default=[], metavar="SRC[:DST]", help="bind a host folder into the container (repeatable)")
    parser.add_argument("--mpi", default="pmi2", choices=MPI_PLUGINS,
                        help="srun's MPI plugin: pmi2 for MPICH/Intel MPI (the default, the mpich wheel), pmix for Open MPI")
    parser.add_argument("--cpu", action="store_true", help="a CPU job: no GPUs, --gpu cpu, one worker per CPU of the task")
    parser.add_argument("--ntasks-per-node", type=int, default=1, help="MPI ranks per node (default 1: one rank drives all GPUs of its node)")
    parser.add_argument("--cpus-per-task", type=int, help="CPUs per rank (default 4 per GPU, or 1 with --cpu)")
    parser.add_argument("--warning", type=int, default=300, metavar="SECONDS",
                        help="walltime warning: Slurm signals the job this long before its end (default 300)")
    parser.add_argument("--grace", type=int, help="seconds the run may finish running items after the warning (default warning - 60)")
    parser.add_argument("--max-requeues", type=int, default=20, help="stop requeueing after this many restarts (default 20)")
    parser.add_argument("--job-name", help="job name (default: the program's name)")
    parser.add_argument("--module", action="append", default=[], dest="modules", metavar="NAME",
                        help="environment module to load first (repeatable), e.g. --module openmpi/4.1")
    parser.add_argument("--venv", default=".venv", help="virtual environment to activate, relative to the submit folder ('none': none)")
    parser.add_argument("--submit", action="store_true", help="hand the script to sbatch instead of printing it")
    parser.add_argument("--shipped", metavar="FOLDER", type=folder, help="write the project's shipped scripts into FOLDER and exit")
    return parser


def spec_from_args(args: argparse.Namespace, command: List[str]) -> JobSpec:
    gpu_type, gpus_per_node = parse_gpus(args.gpus_per_node)
    return JobSpec(command=command, nodes=args.nodes, gpus_per_node=gpus_per_node, gpu_type=gpu_type, time=args.time,
                   cpu=args.cpu, ntasks_per_node=args.ntasks_per_node, cpus_per_task=args.cpus_per_task,
                   partition=args.partition, account=args.account, container=args.container,
                   binds=list(args.bind), mpi=args.mpi, warning=args.warning, grace=args.grace,
                   job_name=args.job_name, modules=list(args.modules),
                   venv=None if args.venv == "none" else args.venv, max_requeues=args.max_requeues).check()
