"""Progress at rank 0: items done of all items on every node, failures, rate, ETA.

In a terminal, a tqdm bar. Anywhere else (Slurm's ``slurm-%j.out``, a pipe, a file) a carriage-return
bar becomes one endless line, so there it is a plain line every ``every`` seconds instead
(``MULTINODE_GPU_PROGRESS_SECONDS``, default 30), and one at the end.
"""
from __future__ import annotations

import sys
import threading
from typing import Any, Optional, TextIO

from common import settings
from common.clock import SYSTEM_CLOCK, Clock

PROGRESS_SECONDS = settings.DEFAULTS.progress_seconds


def format_seconds(seconds: Optional[float]) -> str:
    """1h02m, 3m05s, 42s; "?" when unknown."""
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "?"
    seconds = int(round(seconds))
    if seconds >= 86400:
        return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


class Progress:
    def __init__(self, total: int, done: int, label: str, enabled: bool = True,
                 stream: Optional[TextIO] = None, every: float = PROGRESS_SECONDS, clock: Clock = SYSTEM_CLOCK):
        """``every``: seconds between plain lines (the run's MULTINODE_GPU_PROGRESS_SECONDS);
        ``clock``: what the elapsed time and the rate are measured on."""
        self.clock = clock
        self.total, self.done, self.label = total, done, label
        self.resumed = done
        self.failed = 0
        self.stream = stream or sys.stderr
        self.started = clock.monotonic()
        self.bar: Optional[Any] = None
        self._lines: Optional[threading.Thread] = None
        self._closed = threading.Event()
        if not enabled:
            return
        if self.stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=done, desc=label, unit="item", dynamic_ncols=True,
                            mininterval=0.2, file=self.stream, smoothing=0.05)
        else:
            self.every = every
            self._lines = threading.Thread(target=self._print_lines, name="progress", daemon=True)
            self._lines.start()

    def line(self, final: bool = False) -> str:
        """``toy: 11/40 items done (28%), 1 failed, 2.4 items/s, ETA 12s, elapsed 5s`` (a failed item
        counts towards the rate and the ETA, not towards done); ``final``: the run's last, with no
        ETA (a stopped run would otherwise end on one)."""
        elapsed = self.clock.monotonic() - self.started
        this_run = self.done - self.resumed
        rate = this_run / elapsed if elapsed > 0 else 0.0
        left = self.total - self.done
        eta = left / rate if rate > 0 else (0.0 if not left else None)
        done = self.done - self.failed
        share = 100.0 * done / self.total if self.total else 100.0
        failed = f", {self.failed} failed" if self.failed else ""
        remaining = "" if final else f"ETA {format_seconds(eta)}, "
        return (f"{self.label}: {done}/{self.total} items done ({share:.0f}%){failed}, {rate:.3g} items/s, "
                f"{remaining}elapsed {format_seconds(elapsed)}")

    def _print_lines(self) -> None:
        while not self._closed.wait(self.every):
            self._print(self.line())

    def _print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def advance(self, count: int = 1, failed: bool = False) -> None:
        """``count`` more items resolved (rank 0 counts a batch of results at once: the bar's
        update is not free)."""
        self.done += count
        if failed:
            self.failed += count
        if self.bar is None:
            return
        if self.failed:  # the bar counts items resolved: say how many of them failed (and so how many did not)
            self.bar.set_postfix_str(f"{self.done - self.failed} ok, {self.failed} failed", refresh=False)
        self.bar.update(count)

    def write(self, message: str) -> None:
        """A log line that does not tear the bar."""
        if self.bar is None:
            self._print(message)
            return
        from tqdm import tqdm

        tqdm.write(message, file=self.stream)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self._lines is not None and not self._closed.is_set():
            self._closed.set()
            self._lines.join()
            self._print(self.line(final=True))
