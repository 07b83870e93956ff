"""Slurm batch scripts from one template: ``python -m common.slurm ... -- mnist_svm 24``.

``spec`` checks what a job asks for, ``template`` turns it into a walltime-safe script,
``arguments`` is the generator's parser, ``program`` checks the program a script runs on the login
node, ``shipped`` lists the scripts checked in under ``slurm/``, ``__main__`` is the command line.
"""
from .spec import JobSpec, parse_walltime
from .template import render

__all__ = ["JobSpec", "parse_walltime", "render"]
