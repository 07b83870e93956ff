"""Command line of the generator: print a batch script, or hand it to ``sbatch``.

    python -m common.slurm --nodes 4 --gpus-per-node 4 --time 24:00:00 -- mnist_svm 24 --batch 50
    python -m common.slurm --shipped slurm     # rewrite the scripts checked in under slurm/
"""
from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import subprocess
import sys
from typing import List, Optional

from ..errors import EXIT_USAGE, UsageError
from .arguments import build_parser, spec_from_args
from .program import check_container, check_program, data_note, uri_note, venv_note
from .shipped import write_shipped
from .template import render


def check_shipped_alone(args: argparse.Namespace, command: List[str]) -> None:
    """--shipped writes the fixed set of scripts: any other option or a program would be ignored, so refuse it."""
    parser = build_parser()
    defaults = vars(parser.parse_args([]))
    flags = {action.dest: action.option_strings[0] for action in parser._actions if action.option_strings}
    given = [flags[name] for name, value in vars(args).items()
             if name != "shipped" and value != defaults[name]]
    if command:
        given.append("-- " + " ".join(command))
    if given:
        raise UsageError(f"--shipped takes no other options (got {', '.join(given)}): "
                         f"the shipped scripts' options are in common/slurm/shipped.py")


def _mpich_wheel_here() -> bool:
    """Whether this environment's MPI is the ``mpich`` wheel (make install's), which has no PMIx."""
    try:
        importlib.metadata.distribution("mpich")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: List[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1:]
    try:
        args = build_parser().parse_args(argv)
        if args.shipped:
            check_shipped_alone(args, command)
            for path in write_shipped(args.shipped):
                print(path)
            return 0
        spec = spec_from_args(args, command)
        program_args = check_program(spec.command, cpu_job=spec.cpu)
        check_container(spec.container)
        script = render(spec)
        for note in (venv_note(spec.venv, spec.container), data_note(program_args, spec.container),
                     uri_note(spec.container)):
            if note:
                print(f"python -m common.slurm: note: {note}", file=sys.stderr)
        for source in spec.bind_sources if spec.container else []:
            if not os.path.exists(source):  # a typo, or a folder only the compute nodes have: the job checks again
                print(f"python -m common.slurm: note: --bind {source}: not found on this host; the job checks it again "
                      f"on its first node and ends with one line if it is missing there", file=sys.stderr)
        if spec.mpi == "pmix" and (spec.container or _mpich_wheel_here()):  # right for an Open MPI build only
            where = "the project's images carry" if spec.container else "this environment's mpi4py runs on"
            print(f"python -m common.slurm: note: --mpi pmix: {where} the mpich wheel, built without PMIx, whose "
                  f"ranks would each start as a world of size 1; keep pmix only for an Open MPI build "
                  f"(docs/slurm.md), else use --mpi pmi2", file=sys.stderr)
        if not args.submit:
            sys.stdout.write(script)
            return 0
        if shutil.which("sbatch") is None:
            raise UsageError("--submit: sbatch not found; run this on a Slurm login node (or drop --submit)")
    except UsageError as error:
        print(f"python -m common.slurm: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    return subprocess.run(["sbatch"], input=script, text=True).returncode


if __name__ == "__main__":
    raise SystemExit(main())
