"""A rank's spawned worker processes, one or more per GPU: the pool that starts, pins and replaces
them (``pool``), the watchdog that kills silent or overrunning ones (``watchdog``), the policy that
picks a worker for a bundle (``placement``), the worker process itself (``worker``), what the app's
code leaves running when a worker ends (``leftovers``), named resource pools (``resources``) and
whether a worker can import the app's code at all (``spawnable``).

May import ``observe``, ``results`` and the package root; not ``ranks`` or ``run``.
"""
