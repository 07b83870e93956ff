"""The program from command line to exit code: flags (``cli``) and ``main(AppClass)`` (``runner``, which imports the ``engine`` when called).

Owns the order of a run: settings and flags checked, the MPI world joined, workers started, the
leader or follower run, the outputs written, the exit code chosen. May import every other layer.
"""
