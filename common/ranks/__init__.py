"""MPI ranks: the world (``mpi``), rank 0 leading and the others following (``distribute``), the
heartbeats between them and the ranks lost (``liveness``), rank 0's bookkeeping of items
(``scheduler``).

May import ``workers``, ``results``, ``observe`` and the package root; not ``run``.
"""
