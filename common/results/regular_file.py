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
