"""Whether a spawned worker can find the app's code: multiprocessing's 'spawn' starts a fresh
interpreter that imports what it is sent by module and name, and makes the parent's ``__main__``
again only where it can (a script's file, or ``python -m module``)."""
from __future__ import annotations

import multiprocessing
import os
import sys


def main_is_importable() -> bool:
    """Whether a spawned process can make this ``__main__`` again: run as a module (python -m), or
    from a file that is there. Not a package's ``__main__`` (python -m package, python folder/, a
    zipapp): spawn leaves those out on purpose."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name == "__main__" or (name or "").endswith(".__main__"):
        return False
    if name:
        return True
    path = getattr(main, "__file__", None)
    if not isinstance(path, str):
        return False
    started_in = multiprocessing.process.ORIGINAL_DIR  # where spawn looks for a relative one, as here
    return os.path.isfile(os.path.join(started_in, path) if started_in else path)


def unreachable_from_workers(thing: object) -> bool:
    """Whether ``thing`` (a function or class) lives in a ``__main__`` the workers cannot make again."""
    return getattr(thing, "__module__", None) == "__main__" and not main_is_importable()


def module_beside_main() -> str:
    """Where an app's code could go instead of a package's ``__main__``: ``PACKAGE/app.py``."""
    name = getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", None) or ""
    package = name.rpartition(".")[0]
    return f"{package.replace('.', '/')}/app.py" if package else "a file such as app.py"
