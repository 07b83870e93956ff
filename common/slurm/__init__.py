"""Slurm batch scripts from one template: ``python -m common.slurm ... -- mnist_svm 24``.

``spec`` checks what a job asks for, ``template`` turns it into a walltime-safe script,
``arguments`` is the generator's parser, ``program`` checks the program a script runs on the login
node, ``shipped`` lists the scripts checked in under ``slurm/``, ``__main__`` is the command line.

On top of the engine: may import every layer below it and pipeline/ (a script that runs a pipeline
definition is checked as the runner would check it); nothing imports it.
"""
from .spec import JobSpec, parse_walltime
from .template import render

__all__ = ["JobSpec", "parse_walltime", "render"]
