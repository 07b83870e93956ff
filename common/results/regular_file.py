"""Reading the run's own files (journal, hold, status) without blocking on what is not a file.

A FIFO where ``journal.jsonl`` should be would make a plain ``open`` wait for a writer for ever; a
device could be read without end. These files are always regular files when the engine made them,
so anything else is refused at once, in one line.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Optional, Union

from common.errors import UsageError, quoted

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder"))


class NotRegularFile(UsageError):
    """One of the run's own files is a FIFO, a device, a socket or a folder."""


def kind_of(mode: int) -> str:
    """'a FIFO', 'a socket', ... for a ``st_mode`` that is not a regular file's."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def refuse_unless_regular(path: Union[str, Path], what: str, mode: Optional[int] = None) -> None:
    """Raise :class:`NotRegularFile` where ``path`` exists and is not a regular file (a missing
    one is let through: its reader says so in its own way)."""
    if mode is None:
        try:
            mode = os.stat(path).st_mode
        except OSError:
            return
    if not stat.S_ISREG(mode):
        raise NotRegularFile(f"{quoted(path)} ({what}) is {kind_of(mode)}, not a regular file; move it away")


def in_place(path: Union[str, Path], folder: bool, keeps: str = "", devices: bool = False) -> Optional[str]:
    """What stands at ``path`` where the run keeps a folder (``folder``) or a file, in a few words
    ("'p' is a FIFO, where the run keeps a file"); None where nothing does, or what does is right.
    ``keeps`` names the place ("its logs folder"); ``devices`` lets a character device be a file
    (a log sent to /dev/null). A link is judged by what it points to; one to a file not made yet,
    in a folder that is there, is let through (the run makes the file)."""
    if not os.path.lexists(path):
        return None
    keeps = keeps or ("a folder" if folder else "a file")
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        if not folder and os.path.isdir(os.path.dirname(os.path.realpath(path))):
            return None
        if os.path.islink(path):
            return f"{quoted(path)} is a link to {quoted(os.readlink(path))}, which does not exist"
        return f"{quoted(path)} cannot be read ({error.strerror or error})"
    if folder and not stat.S_ISDIR(mode):
        return f"{quoted(path)} is {'a file' if stat.S_ISREG(mode) else kind_of(mode)}, where the run keeps {keeps}"
    if not folder and not stat.S_ISREG(mode) and not (devices and stat.S_ISCHR(mode)):
        return f"{quoted(path)} is {kind_of(mode)}, where the run keeps {keeps}"
    return None


def read_regular(path: Union[str, Path], what: str, offset: int = 0) -> bytes:
    """The bytes of ``path`` from ``offset``; :class:`NotRegularFile` at once where it is not a
    regular file (opened without blocking, checked on the open file, so no race lets one by)."""
    refuse_unless_regular(path, what)  # a socket cannot even be opened: say what it is first
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        refuse_unless_regular(path, what, os.fstat(fd).st_mode)
        chunks = []
        position = offset
        while True:
            chunk = os.pread(fd, 1 << 20, position)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            position += len(chunk)
    finally:
        os.close(fd)
