"""The progress bar at rank 0: items done of all items on every node, failures, ETA."""
from __future__ import annotations

import sys
from typing import Any, Optional


class Progress:
    def __init__(self, total: int, done: int, label: str, enabled: bool = True):
        self.failed = 0
        self.bar: Optional[Any] = None
        if enabled:
            from tqdm import tqdm

            interactive = sys.stderr.isatty()
            self.bar = tqdm(total=total, initial=done, desc=label, unit="item", dynamic_ncols=True,
                            mininterval=0.2 if interactive else 10.0, file=sys.stderr, smoothing=0.05)

    def advance(self, failed: bool = False) -> None:
        if self.bar is None:
            return
        if failed:
            self.failed += 1
            self.bar.set_postfix(failed=self.failed, refresh=False)
        self.bar.update(1)

    def write(self, message: str) -> None:
        """A log line that does not tear the bar."""
        from tqdm import tqdm

        tqdm.write(message, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
