"""Linux process controls (prctl) used by workers and pipeline steps; no-ops elsewhere."""
from __future__ import annotations

import ctypes
from typing import Optional

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _load_libc() -> Optional[ctypes.CDLL]:
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return None


#: loaded once, in the parent: a forked child (a pipeline step's preexec_fn) only calls it
_LIBC = _load_libc()


def prctl(option: int, arg: int) -> bool:
    """``prctl(option, arg)``; whether it worked (False without glibc)."""
    return _LIBC is not None and _LIBC.prctl(option, arg, 0, 0, 0) == 0


def die_with_parent(signum: int) -> bool:
    """Have Linux send ``signum`` to this process when its parent dies."""
    return prctl(PR_SET_PDEATHSIG, int(signum))
