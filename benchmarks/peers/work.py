"""The item every system runs: sleep for its duration and say when it ran. One item of a fault
workload SIGKILLs (``kill``) or SIGSTOPs (``stop``) its own worker on its first attempt only (a
marker file tells a retry from the first run), and notes when."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Tuple


def first_attempt(marker_dir: str, index: int) -> bool:
    """True once per item: the first caller creates the marker."""
    try:
        os.close(os.open(os.path.join(marker_dir, f"fault-{index}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def work(index: int, seconds: float, fault: str = "", marker_dir: str = "") -> Tuple[int, float, float]:
    """(index, start, end), epoch seconds."""
    start = time.time()
    if fault and first_attempt(marker_dir, index):
        Path(marker_dir, f"fault-{index}.time").write_text(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
    if seconds:
        time.sleep(seconds)
    return index, start, time.time()
